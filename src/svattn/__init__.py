"""svattn: Support-Vector Attention with certified selection and exact unlearning.

Subpackages
-----------
exact
    The certified core (numpy/scipy float64, no torch): the incremental and
    decremental SVDD memory, the independent oracle, deletion certificates.
"""

__version__ = "0.1.0"
