"""Fixtures of the exact core's tests that cost a build: Go's independent tlog verifier."""

from __future__ import annotations

import pytest

import tlog_helpers


@pytest.fixture(scope="session")
def go_tlog(tmp_path_factory):
    """Go's note/tlog verifier (tests/tlog_helpers.py), built once; skipped, with the
    missing part named, where the toolchain or golang.org/x/mod is absent."""
    why = tlog_helpers.missing()
    if why is not None:
        pytest.skip(f"Go's independent verifier unavailable: {why}")
    work = tmp_path_factory.mktemp("go_tlog")
    return tlog_helpers.GoVerifier(tlog_helpers.build(work), work)
