"""Test-suite settings and fixtures shared by every folder: a memory's deletion
certificate and a saved stream's model erasure receipt, the material of the tests of
crafted receipts and files."""

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


@pytest.fixture(scope="module")
def certificate():
    """A memory of 20 keys and the certificate of its removal of one."""
    import numpy as np

    from svattn.exact import SVDDMemory

    mem = SVDDMemory(C=0.2)
    ids = mem.extend(np.random.default_rng(1).normal(size=(20, 3)))
    return mem, mem.remove(ids[3])


@pytest.fixture(scope="module")
def forgot(tmp_path_factory):
    """A model, a stream that forgot [10, 14) saved in a folder, and the receipt."""
    from stream_helpers import text_of, tiny_model

    model = tiny_model()
    s = model.stream()
    s.feed(text_of(40))
    receipt = s.forget(10, 14).receipt
    folder = tmp_path_factory.mktemp("st") / "stream"
    s.save(folder)
    return model, folder, receipt
