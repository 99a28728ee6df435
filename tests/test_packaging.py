"""The package's own metadata (pyproject.toml) as setuptools reads it for a build."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_metadata_builds_without_a_deprecation_warning(monkeypatch):
    # `project.license` as a TOML table made every `pip install` warn that builds stop
    # working after 2027-02-18; an SPDX expression and license-files do not
    setuptools_config = pytest.importorskip("setuptools.config.pyprojecttoml")
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)  # license-files and the readme are relative to the root
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a SetuptoolsDeprecationWarning fails here
        dist = setuptools_config.apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"
    assert [Path(f).name for f in dist.metadata.license_files] == ["LICENSE"]


def test_the_license_file_is_the_apache_2_text_and_the_build_can_read_it():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    for pattern in meta["project"]["license-files"]:
        assert list(ROOT.glob(pattern)), f"license-files pattern {pattern!r} matches nothing"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    # PEP 639 fields need setuptools >= 77 in the isolated build environment
    from packaging.requirements import Requirement

    (setuptools,) = [Requirement(r) for r in meta["build-system"]["requires"]
                     if Requirement(r).name == "setuptools"]
    assert "77.0" in setuptools.specifier and "76.9" not in setuptools.specifier
