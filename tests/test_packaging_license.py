"""Every pyproject.toml (the project's and contrib/'s) states its license as an SPDX string, which setuptools
>= 77 reads without the ``project.license`` deprecation banner that ``make setup`` used to print per build."""

from __future__ import annotations

import os
import tomllib
import warnings
from pathlib import Path

import pytest
import setuptools
from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parents[1]
PYPROJECTS = [ROOT / "pyproject.toml", *sorted(ROOT.glob("contrib/*/pyproject.toml"))]


@pytest.mark.parametrize("path", PYPROJECTS, ids=[str(p.relative_to(ROOT)) for p in PYPROJECTS])
def test_license_is_an_spdx_string_read_without_a_warning(path, monkeypatch):
    data = tomllib.loads(path.read_text())
    assert data["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in data["build-system"]["requires"]  # PEP 639's string form
    monkeypatch.chdir(path.parent)  # setuptools resolves readme and packages from the project's folder
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), os.fspath(path))
    assert dist.metadata.license_expression == "Apache-2.0"
    assert [str(w.message) for w in caught if "license" in str(w.message).lower()] == []


def test_the_installed_setuptools_reads_the_string_form():
    major = int(setuptools.__version__.split(".")[0])
    assert major >= 77, setuptools.__version__
