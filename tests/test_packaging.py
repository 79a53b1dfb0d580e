"""pyproject.toml, environment.yml and the Dockerfile describe one environment, not three."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def extra(name: str) -> list[Requirement]:
    """An extra's requirements, with the extras it names of this project itself expanded."""
    project = pyproject()["project"]
    found = []
    for req in map(Requirement, project["optional-dependencies"][name]):
        own = req.name == project["name"]
        found += [r for e in sorted(req.extras) for r in extra(e)] if own else [req]
    return found


def pyproject_requirements() -> dict[str, str]:
    reqs = [*map(Requirement, pyproject()["project"]["dependencies"]), *extra("dev")]
    return {r.name: str(r.specifier) for r in reqs}


def test_torch_ranges_admit_the_tested_and_newer_releases():
    reqs = pyproject_requirements()
    torch, vision = (
        Requirement(f"torch{reqs['torch']}"),
        Requirement(f"torchvision{reqs['torchvision']}"),
    )
    for version in ("2.6.0", "2.14.1", "3.0.0"):
        assert torch.specifier.contains(version), version
    assert not torch.specifier.contains("2.5.1")
    for version in ("0.29.1", "0.30.0"):
        assert vision.specifier.contains(version), version


def test_environment_yml_has_the_same_packages_as_pyproject():
    conda = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in conda["dependencies"] if isinstance(d, dict))
    conda_reqs = {Requirement(r).name: str(Requirement(r).specifier) for r in pip_section}
    assert conda_reqs == pyproject_requirements()
    python = next(
        d for d in conda["dependencies"] if isinstance(d, str) and d.startswith("python=")
    )
    minimum = pyproject()["project"]["requires-python"].lstrip(">=")
    assert Version(python.split("=")[1]) >= Version(minimum)


def test_dockerfile_installs_from_pyproject_on_a_cuda_torch_base():
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"ARG BASE_IMAGE=pytorch/pytorch:(\d+\.\d+\.\d+)-cuda[\d.]+-cudnn\d+", text)
    assert base, "the base image is an official CUDA PyTorch image"
    assert Requirement(f"torch{pyproject_requirements()['torch']}").specifier.contains(base[1])
    installed = re.search(r"pip install -e '\.\[([\w,]+)\]'", text)
    assert installed, "packages come from pyproject.toml, not a list"
    extras = installed[1].split(",")
    assert "dev" not in extras and {"lab", "frameworks"} <= set(extras)
    image = {r.name for e in extras for r in extra(e)}
    assert image.isdisjoint({"pytest", "pytest-xdist", "ruff", "playwright", "nbval"})
    assert re.search(r"^USER (?!root)\w+", text, re.M), "runs as a non-root user"
    assert "EXPOSE 8888" in text and "JUPYTER_TOKEN" in text
    assert "ARG PIP_INDEX_URL" in text, "a build argument for a PyPI mirror"


def test_dockerfile_pins_the_torch_that_was_tested():
    """The image installs the torch and torchvision this test suite runs on (the tested pair)."""
    text = (ROOT / "Dockerfile").read_text()
    tested = {name: metadata.version(name).split("+")[0] for name in ("torch", "torchvision")}
    base = re.search(r"ARG BASE_IMAGE=pytorch/pytorch:(\d+\.\d+\.\d+)-", text)[1]
    pinned = re.search(r"^ARG TORCH_VERSION=(\S+)$", text, re.M)[1]
    assert base == pinned == tested["torch"], "pin the torch the kit was tested with"
    assert re.search(rf"^ARG TORCHVISION_VERSION={re.escape(tested['torchvision'])}$", text, re.M)
    assert 'pip install "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"' in text
    assert Requirement(f"torch{pyproject_requirements()['torch']}").specifier.contains(pinned)


def slow_imports() -> list[str]:
    return re.search(r"^SLOW_IMPORTS := (.+)$", (ROOT / "Makefile").read_text(), re.M)[1].split()


def test_every_set_up_removes_the_slow_optional_imports():
    """``make setup`` and the image both uninstall them; conda users are told how."""
    names = slow_imports()
    assert names, "the Makefile lists the packages it removes"
    docker = (ROOT / "Dockerfile").read_text()
    conda = (ROOT / "environment.yml").read_text()
    for name in names:
        assert re.search(rf"pip uninstall --yes {name}\b", docker), f"the image keeps {name}"
        assert f"pip uninstall -y {name}" in conda, f"environment.yml does not mention {name}"


def test_nbformat_imports_none_of_them_in_the_kits_venv():
    """The saving is real where ``make setup`` built the interpreter running these tests."""
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("not the venv of make setup (a conda or system interpreter)")
    modules = [name.replace("-", "_") for name in slow_imports()]
    probe = f"import sys, nbformat; print([m for m in {modules!r} if m in sys.modules])"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr
