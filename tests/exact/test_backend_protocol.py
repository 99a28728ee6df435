"""Both backends are held to the declared interface (svattn.exact.backends.protocol.Backend)."""

from __future__ import annotations

import types

import pytest

from svattn.exact.backends import compiled, reference
from svattn.exact.backends.protocol import Backend, conforms, declared
from svattn.exact.memory import BACKENDS


@pytest.mark.parametrize("module", [compiled, reference], ids=["compiled", "reference"])
def test_each_backend_conforms_to_the_protocol(module):
    assert conforms(module) == []


def test_the_memory_offers_exactly_the_two_backends():
    assert BACKENDS == {"compiled": compiled, "reference": reference}
    assert {m.NAME for m in BACKENDS.values()} == set(BACKENDS)


def test_the_check_names_each_kind_of_departure():
    """A module missing a member, with a differing signature, or exporting an
    undeclared name is reported (so the test above could fail)."""
    fake = types.ModuleType("fake")
    fake.__all__ = ["NAME", "kkt", "helper"]
    fake.NAME = "fake"

    def kkt(ss, g, extra):  # one parameter too many, no annotations
        return 0.0

    fake.kkt = kkt
    problems = conforms(fake)
    assert any("lacks drive" in p for p in problems)
    assert any("fake.kkt" in p and "differs" in p for p in problems)
    assert any("fake.helper is exported but not declared" in p for p in problems)
    assert len(declared()) == 1 + sum(
        1 for n, f in vars(Backend).items() if callable(f) and not n.startswith("_"))
