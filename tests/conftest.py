"""Test-suite settings shared by every folder."""

import os

from hypothesis import settings

# CI runs each property test on a fixed sequence of examples (reproducible, never
# flaky); local runs draw fresh examples each time and so keep exploring.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
