"""How one operation runs, for either backend: the layer over the backends.

:mod:`~svattn.exact.operations.validation` checks the input;
:mod:`~svattn.exact.operations.solver` is the shared algorithm (removal, polish,
re-solve) and :mod:`~svattn.exact.operations.ingest` the adds, with the batch solver
of a block or a re-solve in :mod:`~svattn.exact.operations.batch`;
:mod:`~svattn.exact.operations.rollback` makes the operation atomic and
:mod:`~svattn.exact.operations.health` reads the numerical health after it.
"""
