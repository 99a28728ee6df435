"""The certified core: exact float64 SVDD memory (numpy/scipy only, never torch)."""

from svattn.exact.kernels import KERNELS, KernelOverflowError, default_gamma, kernel_matrix

__all__ = ["KERNELS", "KernelOverflowError", "default_gamma", "kernel_matrix"]
