"""Real data sets and their loaders (numpy and the standard library only).

Modules
-------
icu
    Hourly vital-sign vectors from the MIMIC-III demo and PhysioNet 2012, with
    the critical-hour rule and the MIMIC-III slice shipped in ``slices/``.
news2
    The National Early Warning Score 2 (RCP 2017) tables and its high-risk
    flag, scored from those vitals.
"""
