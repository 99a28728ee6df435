"""The docstring examples of the enwik8 loader run."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "svattn.data.enwik8",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 1
