"""Doctest collection of ``src/``: modules that need an optional extra are skipped without it."""

import importlib.util

# svattn.press.presses subclasses kvpress's presses at import (the ``press`` extra)
collect_ignore = ([] if importlib.util.find_spec("kvpress") is not None
                  else ["svattn/press/presses.py", "svattn/press/fanout.py"])
