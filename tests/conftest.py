"""Shared fixtures: each notebook is executed headlessly once per test session, then reused."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from helpers import record, runner
from helpers.procs import descendants, is_alive


@pytest.fixture(scope="session")
def notebook_run(tmp_path_factory: pytest.TempPathFactory):
    """Execute a notebook in quick mode with papermill (once) and return its Outcome."""
    cache: dict[str, runner.Outcome] = {}

    def run(stem: str) -> runner.Outcome:
        if stem not in cache:
            cache[stem] = runner.execute(stem, tmp_path_factory.mktemp(stem), quick=True)
        return cache[stem]

    return run


@pytest.fixture(scope="session")
def notebook_record(notebook_run):
    """The metrics.json of a notebook that must have run cleanly."""

    def load(stem: str) -> dict[str, Any]:
        outcome = notebook_run(stem)
        assert outcome.status == "ok", f"{stem} failed headless:\n{outcome.error}"
        return record.load(Path(outcome.out_dir) / "metrics.json")

    return load


def live_children() -> list[int]:
    """Processes of this test session still running (zombies excluded)."""
    return [p for p in descendants(os.getpid()) if is_alive(p)]


@pytest.fixture
def no_orphans():
    """Fail the test if it leaves any child process running."""
    before = set(live_children())
    yield
    left = [p for p in live_children() if p not in before]
    assert not left, f"processes left running: {left}"
