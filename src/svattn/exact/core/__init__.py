"""The bottom layer of the exact core: the solver state and what it is made of.

:mod:`~svattn.exact.core.state` (``SlotState``: every array and scalar of one
memory's solver), :mod:`~svattn.exact.core.kktsets` (the KKT sets a token is in:
reserve, margin, error, and the solver's own driven/free marks),
:mod:`~svattn.exact.core.cache` (the kernel-column cache and the bordered system's
inverse), :mod:`~svattn.exact.core.kernels` and :mod:`~svattn.exact.core.gram`
(the kernel formulas and the margin Gram's kept factor),
:mod:`~svattn.exact.core.hashes` (token and row hashes of the state digest),
:mod:`~svattn.exact.core.conventions` (the warm-up n·C < 1 and the empty-margin mu),
:mod:`~svattn.exact.core.outcome` (what an operation found, returned),
:mod:`~svattn.exact.core.errors` (the errors a public operation raises) and
:mod:`~svattn.exact.core.compiling` (the notice when numba must compile a kernel, and
the quick load of a cached one).
Nothing here imports another layer of :mod:`svattn.exact` (``docs/design.md`` §6).
"""

from svattn.exact.core.compiling import install as _announce_compiles

_announce_compiles()  # a compile of any kernel of svattn's says so on stderr (compiling.py)
