"""The exact solver behind scikit-learn's estimator contract.

:class:`SVDD` (``svattn.SVDD``, :mod:`svattn.estimators.svdd`) is a one-class SVM
that learns, forgets and proves it: rows are addressed by the ids the user holds
(:mod:`svattn.estimators.rows`), every forget returns a :class:`ForgetReceipt` (JSON,
signed with the controller's key, its removals in the model's audit log), and
:func:`verify_forget_receipt` checks one through the exact core's verifiers
(:mod:`svattn.estimators.receipt`).
"""

from svattn.estimators.box import InfeasibleBoxWarning
from svattn.estimators.receipt import (
    ForgetReceipt,
    ForgetReceiptVerification,
    verify_forget_receipt,
)
from svattn.estimators.svdd import SVDD

__all__ = ["SVDD", "InfeasibleBoxWarning", "ForgetReceipt", "ForgetReceiptVerification",
           "verify_forget_receipt"]
