"""Test-suite settings shared by every folder."""

import os

import pytest
from hypothesis import settings

import tlog_helpers

# CI runs each property test on a fixed sequence of examples (reproducible, never
# flaky); local runs draw fresh examples each time and so keep exploring.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(scope="session")
def go_tlog(tmp_path_factory):
    """Go's note/tlog verifier (tests/tlog_helpers.py), built once; skipped, with the
    missing part named, where the toolchain or golang.org/x/mod is absent."""
    why = tlog_helpers.missing()
    if why is not None:
        pytest.skip(f"Go's independent verifier unavailable: {why}")
    work = tmp_path_factory.mktemp("go_tlog")
    return tlog_helpers.GoVerifier(tlog_helpers.build(work), work)
