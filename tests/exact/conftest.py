"""Fixtures shared by the tests of the exact core."""

from __future__ import annotations

import pytest

from svattn.exact.backends import compiled


@pytest.fixture
def whole_tests(monkeypatch) -> list[int]:
    """The compiled backend's general uniqueness test (the block of the margin set and the
    tied tokens from the keys, factored whole), spied on: the size of each block it tests."""
    calls: list[int] = []
    whole = compiled.positive_definite

    def counted(K, rel_shift):
        calls.append(len(K))
        return whole(K, rel_shift)

    monkeypatch.setattr(compiled, "positive_definite", counted)
    return calls
