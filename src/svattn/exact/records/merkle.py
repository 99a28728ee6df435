"""RFC 6962 / RFC 9162 Merkle trees: hashes, roots, inclusion and consistency proofs.

The hashes of RFC 6962 §2.1 (RFC 9162 §2.1.1)::

    leaf hash  = SHA-256(0x00 || entry bytes)
    node hash  = SHA-256(0x01 || left || right)
    MTH({})    = SHA-256()            (the empty tree)
    MTH(D[n])  = node(MTH(D[0:k]), MTH(D[k:n]))   k = the largest power of 2 below n

Two spellings of each computation sit side by side:

* the **reference** (:func:`reference_root`, :func:`reference_inclusion_path`,
  :func:`reference_consistency_proof`): the RFC's recursive definitions over a list of
  leaf hashes, slice by slice, as the RFC writes them (slow, obviously correct);
* the **fast** one: :class:`MerkleTree` keeps every complete subtree's hash (level by
  level), so a root or a proof reads O(log n) stored hashes; :class:`CompactRange`
  keeps only the O(log n) peaks a writer needs to append and state the root.

The verifiers (:func:`verify_inclusion`, :func:`verify_consistency`) are RFC 9162
§2.1.3.2 and §2.1.4.2, step by step. ``tests/exact/test_merkle.py`` holds the fast
forms equal to the reference for every size and index up to 70 leaves; Go's
``golang.org/x/mod/sumdb/tlog`` (an implementation sharing no code with this one)
checks the proofs in ``tests/exact/test_tlog_independent.py``.

Examples
--------
>>> leaves = [leaf_hash(b"entry %d" % i) for i in range(5)]
>>> tree = MerkleTree(leaves)
>>> tree.root(5) == reference_root(leaves)
True
>>> verify_inclusion(leaves[3], 3, 5, tree.inclusion_path(3, 5), tree.root(5))
True
>>> verify_consistency(2, 5, tree.consistency_proof(2, 5), tree.root(2), tree.root(5))
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(entry: bytes) -> bytes:
    """SHA-256(0x00 || entry): the hash of one log entry (RFC 6962 §2.1)."""
    return hashlib.sha256(b"\x00" + bytes(entry)).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right): an interior node (RFC 6962 §2.1)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of 2 strictly below ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


# ---------------------------------------------------------------- the reference
def reference_root(leaves: Sequence[bytes]) -> bytes:
    """MTH of a list of leaf hashes, by the RFC's recursive definition."""
    n = len(leaves)
    if n == 0:
        return EMPTY_ROOT
    if n == 1:
        return leaves[0]
    k = _split(n)
    return node_hash(reference_root(leaves[:k]), reference_root(leaves[k:]))


def reference_inclusion_path(m: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PATH(m, D[n]) of RFC 6962 §2.1.1 (leaf sibling first, the root's child last)."""
    n = len(leaves)
    if not 0 <= m < n:
        raise ValueError(f"index {m} is outside a tree of {n} leaves")
    if n == 1:
        return []
    k = _split(n)
    if m < k:
        return reference_inclusion_path(m, leaves[:k]) + [reference_root(leaves[k:])]
    return reference_inclusion_path(m - k, leaves[k:]) + [reference_root(leaves[:k])]


def reference_consistency_proof(m: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PROOF(m, D[n]) = SUBPROOF(m, D[n], true) of RFC 6962 §2.1.2 (empty for m = n and
    for m = 0: every tree extends the empty one)."""
    n = len(leaves)
    if not 0 <= m <= n:
        raise ValueError(f"size {m} is not between 0 and the tree's {n} leaves")
    if m in (0, n):
        return []

    def subproof(m: int, d: Sequence[bytes], b: bool) -> list[bytes]:
        n = len(d)
        if m == n:
            return [] if b else [reference_root(d)]
        k = _split(n)
        if m <= k:
            return subproof(m, d[:k], b) + [reference_root(d[k:])]
        return subproof(m - k, d[k:], False) + [reference_root(d[:k])]

    return subproof(m, leaves, True)


# ---------------------------------------------------------------- the fast forms
class MerkleTree:
    """Every complete subtree's hash of a list of leaf hashes, level by level.

    ``levels[h][i]`` is the hash of leaves ``[i * 2**h, (i + 1) * 2**h)``; any range the
    RFC's recursion visits is a few of them joined, so a root or a proof of a tree of
    any size up to ``len(leaves)`` costs O(log n) hashes.

    Parameters
    ----------
    leaves : sequence of bytes
        The leaf hashes (:func:`leaf_hash` of each entry), in log order.
    """

    def __init__(self, leaves: Sequence[bytes]) -> None:
        self.levels: list[list[bytes]] = [list(leaves)]
        while len(self.levels[-1]) > 1:
            below = self.levels[-1]
            self.levels.append([node_hash(below[i], below[i + 1])
                                for i in range(0, len(below) - 1, 2)])

    @property
    def size(self) -> int:
        """Number of leaves."""
        return len(self.levels[0])

    def _range(self, lo: int, hi: int) -> bytes:
        """MTH of leaves ``[lo, hi)``, ``lo`` a multiple of the range's split (as in
        every range the RFC's recursion visits)."""
        n = hi - lo
        if n & (n - 1) == 0 and lo % n == 0:  # a complete subtree: stored
            return self.levels[n.bit_length() - 1][lo // n]
        k = _split(n)
        return node_hash(self._range(lo, lo + k), self._range(lo + k, hi))

    def _check(self, n: int) -> None:
        if not 0 <= n <= self.size:
            raise ValueError(f"tree size {n} is outside 0..{self.size}")

    def root(self, n: int | None = None) -> bytes:
        """MTH of the first ``n`` leaves (default: all)."""
        n = self.size if n is None else n
        self._check(n)
        return EMPTY_ROOT if n == 0 else self._range(0, n)

    def inclusion_path(self, m: int, n: int | None = None) -> list[bytes]:
        """PATH(m, D[n]): leaf ``m``'s inclusion proof in the tree of the first ``n``."""
        n = self.size if n is None else n
        self._check(n)
        if not 0 <= m < n:
            raise ValueError(f"index {m} is outside a tree of {n} leaves")
        out: list[bytes] = []
        lo, hi = 0, n
        while hi - lo > 1:  # descend; siblings collected root-side first
            k = _split(hi - lo)
            if m < lo + k:
                out.append(self._range(lo + k, hi))
                hi = lo + k
            else:
                out.append(self._range(lo, lo + k))
                lo = lo + k
        return out[::-1]

    def consistency_proof(self, m: int, n: int | None = None) -> list[bytes]:
        """PROOF(m, D[n]): the tree of the first ``m`` leaves is a prefix of the first ``n``."""
        n = self.size if n is None else n
        self._check(n)
        if not 0 <= m <= n:
            raise ValueError(f"size {m} is not between 0 and {n}")
        if m in (0, n):
            return []
        out: list[bytes] = []
        lo, hi, b = 0, n, True
        while m != hi - lo:
            k = _split(hi - lo)
            if m <= k:
                out.append(self._range(lo + k, hi))
                hi = lo + k
            else:
                out.append(self._range(lo, lo + k))
                lo, m, b = lo + k, m - k, False
        if not b:
            out.append(self._range(lo, hi))
        return out[::-1]


class CompactRange:
    """The peaks of a growing tree (the hashes of its complete subtrees, largest first):
    what an appending writer keeps to state the root after each entry.

    Examples
    --------
    >>> cr = CompactRange()
    >>> leaves = [leaf_hash(bytes([i])) for i in range(7)]
    >>> for h in leaves:
    ...     cr.append(h)
    >>> cr.size, cr.root() == reference_root(leaves)
    (7, True)
    """

    def __init__(self) -> None:
        self.size = 0
        self.peaks: list[bytes] = []

    def copy(self) -> CompactRange:
        """An independent copy (a writer's mark to roll back to)."""
        other = CompactRange()
        other.size, other.peaks = self.size, list(self.peaks)
        return other

    def append(self, leaf: bytes) -> None:
        """Add one leaf hash."""
        self.peaks.append(leaf)
        size = self.size
        while size & 1:  # merge the complete subtrees the new leaf completes
            right = self.peaks.pop()
            self.peaks[-1] = node_hash(self.peaks[-1], right)
            size >>= 1
        self.size += 1

    def root(self) -> bytes:
        """MTH of every leaf appended: the peaks joined from the right."""
        if not self.peaks:
            return EMPTY_ROOT
        acc = self.peaks[-1]
        for peak in reversed(self.peaks[:-1]):
            acc = node_hash(peak, acc)
        return acc


# ---------------------------------------------------------------- the verifiers
def _is_hash(h: object) -> bool:
    return isinstance(h, bytes) and len(h) == HASH_SIZE


def root_from_inclusion(leaf: bytes, index: int, size: int, path: Sequence[bytes]
                        ) -> bytes | None:
    """The root that ``path`` leads ``leaf`` at ``index`` to in a tree of ``size``
    (RFC 9162 §2.1.3.2 steps 1-3), or None when the path cannot fit that tree."""
    if not (0 <= index < size) or not _is_hash(leaf) or not all(map(_is_hash, path)):
        return None
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return r if sn == 0 else None


def verify_inclusion(leaf: bytes, index: int, size: int, path: Sequence[bytes],
                     root: bytes) -> bool:
    """Whether ``path`` proves ``leaf`` (a leaf hash) at ``index`` of the tree of ``size``
    whose root is ``root`` (RFC 9162 §2.1.3.2)."""
    return root_from_inclusion(leaf, index, size, path) == root


def verify_consistency(size1: int, size2: int, proof: Sequence[bytes], root1: bytes,
                       root2: bytes) -> bool:
    """Whether ``proof`` shows the tree of ``size1`` with ``root1`` a prefix of the tree
    of ``size2`` with ``root2`` (RFC 9162 §2.1.4.2; equal sizes: an empty proof and equal
    roots; size 0 extends to anything with an empty proof)."""
    if not (0 <= size1 <= size2) or not all(map(_is_hash, (root1, root2, *proof))):
        return False
    if size1 == size2:
        return not proof and root1 == root2
    if size1 == 0:
        return not proof and root1 == EMPTY_ROOT
    path = list(proof)
    if not path:
        return False
    if size1 & (size1 - 1) == 0:  # a power of 2: the old root is the first node
        path.insert(0, root1)
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == root1 and sr == root2 and sn == 0


__all__ = ["EMPTY_ROOT", "HASH_SIZE", "CompactRange", "MerkleTree", "leaf_hash", "node_hash",
           "reference_consistency_proof", "reference_inclusion_path", "reference_root",
           "root_from_inclusion", "verify_consistency", "verify_inclusion"]
