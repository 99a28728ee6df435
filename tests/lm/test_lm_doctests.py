"""The docstring examples of the LM modules run."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "svattn.lm.model",
    "svattn.lm.configs",
    "svattn.lm.train",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 1
