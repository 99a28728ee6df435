"""svattn: Support-Vector Attention with certified selection and exact unlearning.

Subpackages
-----------
exact
    The certified core (numpy/scipy float64, no torch): the incremental and
    decremental SVDD memory, the independent oracle, deletion certificates.
estimators
    :class:`SVDD`, the one-class SVM that can forget, as a scikit-learn estimator
    (``svattn.SVDD``).
"""

__version__ = "0.1.0"

__all__ = ["SVDD", "__version__"]


def __getattr__(name: str):
    # svattn.SVDD on first use: importing svattn (the CLI, the torch layers) does not
    # pay for scikit-learn's import
    if name == "SVDD":
        from svattn.estimators import SVDD

        return SVDD
    raise AttributeError(f"module 'svattn' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazily imported names too (dir() and tab completion list SVDD)
    return sorted(set(globals()) | set(__all__))
