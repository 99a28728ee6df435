"""The auditor's side: what reads the records back, over the memory (the top layer).

:mod:`~svattn.exact.auditor.verify` checks a certificate or an erasure receipt
against a memory, :mod:`~svattn.exact.auditor.logcheck` an audit log,
:mod:`~svattn.exact.auditor.persist` saves a memory and loads one back re-checking
all of it, and :mod:`~svattn.exact.auditor.recovery` rebuilds a memory from its last
saved state and its audit log after a crash.
"""
