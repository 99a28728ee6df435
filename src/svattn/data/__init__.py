"""Real data sets and their loaders (numpy and the standard library only).

Modules
-------
icu
    Hourly vital-sign vectors from the MIMIC-III demo and PhysioNet 2012, with
    the critical-hour rule and the MIMIC-III slice shipped in ``slices/``.
"""
