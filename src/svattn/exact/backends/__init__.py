"""The two backends of the exact solver, one interface: the layer over the solver state.

:mod:`~svattn.exact.backends.protocol` declares the interface (``Backend``, a
``typing.Protocol``); :mod:`~svattn.exact.backends.reference` is the slow, obviously
correct numpy implementation and :mod:`~svattn.exact.backends.compiled` the numba one,
held to each other and to the protocol by ``tests/exact/test_backends.py`` and
``tests/exact/test_backend_protocol.py``. ``python -m svattn.exact.compile_kernels``
compiles the numba kernels once (``make setup``).
"""
