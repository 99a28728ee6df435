"""A dispatch mode that records every op reading a tensor value back to the host.

On an accelerator each of these waits for the device. On CPU they cost nothing,
which is why the tests look for them instead of timing anything.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Ops whose result is a host value (or whose output size depends on tensor values).
HOST_READS = {
    "aten._local_scalar_dense",  # .item(), float(t), bool(t), int(t)
    "aten.is_nonzero",  # `if t:`
    "aten.equal",  # torch.equal
    "aten.nonzero",  # data-dependent size (also boolean-mask indexing)
    "aten.masked_select",
    "aten._unique2",
    "aten.unique_consecutive",
    # the batched solver's "optimum" finish: the problems go to the host and back
    # (svattn.nn.finish), one call per solve
    "svattn.finish_optimum",
}


class HostReads(TorchDispatchMode):
    """Collect the names of host-reading ops run inside the ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket._qualified_op_name.replace("::", ".")
        if name in HOST_READS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def host_reads_of(fn) -> list[str]:
    """Host-reading ops of ``fn()`` (forward and whatever backward it runs)."""
    with HostReads() as mode:
        fn()
    return mode.seen


__all__ = ["HOST_READS", "HostReads", "host_reads_of", "torch"]
