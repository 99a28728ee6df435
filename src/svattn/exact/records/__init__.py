"""The records an operation leaves: the layer over the operations, under the memory.

:mod:`~svattn.exact.records.certificate` (deletion certificates, erasure receipts,
token commitments), :mod:`~svattn.exact.records.receipts` (the trust model a
verification judges by), :mod:`~svattn.exact.records.signing` (Ed25519 signatures,
tag and commitment keys), :mod:`~svattn.exact.records.audit` (the hash-chained audit
log), :mod:`~svattn.exact.records.schema` (the state file's tensors and fields, with
the readers of schema versions 1-4), :mod:`~svattn.exact.records.fileformat`
(the safetensors file around it: header, checksums, atomic writes),
:mod:`~svattn.exact.records.kcache` (the kernel cache as a recipe, rebuilt from the
keys) and :mod:`~svattn.exact.records.pickled` (a memory's pickle, without the cache).
Reading them back is :mod:`svattn.exact.auditor`'s.
"""
