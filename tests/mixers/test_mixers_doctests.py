"""The docstring examples of the hybrid mixer run."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "svattn.mixers.hybrid",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 1
