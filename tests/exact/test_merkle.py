"""RFC 6962 Merkle trees: the fast forms equal the RFC's recursive definitions, and the
RFC 9162 verifiers accept every true proof and refuse altered ones."""

from __future__ import annotations

import hashlib

import pytest

from svattn.exact.records.merkle import (
    EMPTY_ROOT,
    CompactRange,
    MerkleTree,
    leaf_hash,
    node_hash,
    reference_consistency_proof,
    reference_inclusion_path,
    reference_root,
    verify_consistency,
    verify_inclusion,
)

SIZES = range(0, 71)


def _leaves(n):
    return [leaf_hash(b"entry %d" % i) for i in range(n)]


def test_hashes_are_rfc6962_domain_separated():
    assert leaf_hash(b"") == hashlib.sha256(b"\x00").digest()
    a, b = leaf_hash(b"a"), leaf_hash(b"b")
    assert node_hash(a, b) == hashlib.sha256(b"\x01" + a + b).digest()
    assert reference_root([]) == EMPTY_ROOT == hashlib.sha256(b"").digest()
    # the RFC 6962 test vector of the empty leaf (transparency-dev/merkle's testdata)
    assert leaf_hash(b"").hex() == ("6e340b9cffb37a989ca544e6bb780a2c"
                                    "78901d3fb33738768511a30617afa01d")


@pytest.mark.parametrize("n", SIZES, ids=lambda n: f"n{n}")
def test_fast_roots_and_proofs_equal_the_reference(n):
    leaves = _leaves(n)
    tree, cr = MerkleTree(leaves), CompactRange()
    for h in leaves:
        cr.append(h)
    assert tree.root() == reference_root(leaves) == cr.root()
    for m in range(n + 1):
        assert tree.root(m) == reference_root(leaves[:m])
        assert tree.consistency_proof(m) == reference_consistency_proof(m, leaves)
    for m in range(n):
        assert tree.inclusion_path(m) == reference_inclusion_path(m, leaves)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 32, 33, 70], ids=lambda n: f"n{n}")
def test_every_inclusion_proof_verifies_and_altered_ones_do_not(n):
    leaves = _leaves(n)
    tree = MerkleTree(leaves)
    root = tree.root()
    for m in range(n):
        path = tree.inclusion_path(m)
        assert verify_inclusion(leaves[m], m, n, path, root)
        assert not verify_inclusion(leaf_hash(b"other"), m, n, path, root)
        assert not verify_inclusion(leaves[m], m, n, path, node_hash(root, root))
        if n > 1:
            assert not verify_inclusion(leaves[m], (m + 1) % n, n, path, root)
            assert not verify_inclusion(leaves[m], m, 2 * n, path, root)
        for k in range(len(path)):
            flipped = bytearray(path[k])
            flipped[k % 32] ^= 1
            assert not verify_inclusion(leaves[m], m, n, path[:k] + [bytes(flipped)]
                                        + path[k + 1:], root)
        assert not verify_inclusion(leaves[m], m, n, path + [root], root)
        if path:
            assert not verify_inclusion(leaves[m], m, n, path[:-1], root)
    assert not verify_inclusion(leaves[0], n, n, [], root)  # index outside the tree


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 9, 16, 31, 70], ids=lambda n: f"n{n}")
def test_every_consistency_proof_verifies_and_altered_ones_do_not(n):
    tree = MerkleTree(_leaves(n))
    for m in range(n + 1):
        proof = tree.consistency_proof(m)
        assert verify_consistency(m, n, proof, tree.root(m), tree.root())
        if 0 < m < n:
            assert not verify_consistency(m, n, proof, node_hash(tree.root(m), b"x" * 32),
                                          tree.root())
            assert not verify_consistency(m, n, proof, tree.root(m), tree.root(m))
            assert not verify_consistency(m, n, proof[:-1], tree.root(m), tree.root())
            assert not verify_consistency(m, n, proof + [tree.root()], tree.root(m),
                                          tree.root())
            for k in range(len(proof)):
                flipped = bytearray(proof[k])
                flipped[0] ^= 0x80
                assert not verify_consistency(m, n, proof[:k] + [bytes(flipped)]
                                              + proof[k + 1:], tree.root(m), tree.root())
    assert not verify_consistency(n + 1, n, [], tree.root(), tree.root())


def test_a_rewritten_history_has_no_consistency_proof():
    old = MerkleTree(_leaves(6))
    rewritten = _leaves(10)
    rewritten[2] = leaf_hash(b"rewritten")
    new = MerkleTree(rewritten)
    assert not verify_consistency(6, 10, new.consistency_proof(6), old.root(), new.root())


def test_compact_range_copy_is_independent():
    cr = CompactRange()
    cr.append(leaf_hash(b"a"))
    mark = cr.copy()
    cr.append(leaf_hash(b"b"))
    assert mark.size == 1 and mark.root() == leaf_hash(b"a")
    assert cr.root() == node_hash(leaf_hash(b"a"), leaf_hash(b"b"))


def test_out_of_range_requests_are_refused():
    tree = MerkleTree(_leaves(4))
    with pytest.raises(ValueError, match="outside"):
        tree.inclusion_path(4)
    with pytest.raises(ValueError, match="outside"):
        tree.root(5)
    with pytest.raises(ValueError, match="between"):
        reference_consistency_proof(5, _leaves(4))
