"""A run folder, ``runs/<timestamp>/``: its layout, its ``summary.json``, and reading it back.

``make run`` (labtools.runner) makes the folder and writes one subfolder per notebook
(``metrics.json``, PNG figures, the executed notebook) and ``summary.json``, the status and
seconds of each notebook; labtools.compare and labtools.report_pages read it back. This module
is the one place that knows both sides of ``summary.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from helpers.messages import _
from helpers.record import load


class ReportError(Exception):
    """A run cannot be read, summarised or compared as asked (exit code 2 of labtools.report)."""


def new_run_dir(root: Path) -> Path:
    """runs/<timestamp>/, with runs/latest pointing at it."""
    run_dir = root / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=False)
    latest = root / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(run_dir.name)
    return run_dir


def write_summary(
    run_dir: Path, outcomes: list[Any], quick: bool, params: list[str], lang: str | None
) -> None:
    """summary.json: the run's settings and each notebook's outcome (labtools.runner.Outcome)."""
    summary = {
        "started": run_dir.name,
        "quick": quick,
        "params": params,
        "lang": lang or "en",
        "notebooks": [asdict(o) for o in outcomes],
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


@dataclass
class NotebookRun:
    """One notebook of a run: what the runner said about it, and its record if readable."""

    name: str
    folder: Path
    status: str
    seconds: float | None = None
    error: str | None = None
    record: dict[str, Any] | None = None
    record_error: str | None = None  # why metrics.json could not be read

    @property
    def passed(self) -> bool:
        return self.status == "ok"


@dataclass
class Run:
    path: Path
    summary: dict[str, Any]  # summary.json, or {} when the runner left none
    notebooks: dict[str, NotebookRun]

    def hardware(self) -> dict[str, Any] | None:
        """The hardware block of the first readable record: every notebook ran on one machine."""
        return next((nb.record["hardware"] for nb in self.notebooks.values() if nb.record), None)


def _attach_record(nb: NotebookRun) -> None:
    """Load metrics.json, keeping the reason (which names the file) instead of raising."""
    try:
        record = load(nb.folder / "metrics.json")
    except (OSError, ValueError, TypeError) as exc:
        nb.record_error = str(exc)
        return
    if not isinstance(record["metrics"], dict):
        nb.record_error = f'{nb.folder / "metrics.json"}: "metrics" is not an object'
        return
    nb.record = record


def read_summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    if not path.exists():
        return {}
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: unreadable ({exc})") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("notebooks", []), list):
        raise ReportError(f'{path}: expected an object with a "notebooks" list')
    return summary


def _from_summary(run_dir: Path, entry: Any) -> NotebookRun:
    if not isinstance(entry, dict) or not isinstance(entry.get("notebook"), str):
        raise ReportError(f'{run_dir / "summary.json"}: entry without a "notebook" name: {entry!r}')
    name = Path(entry["notebook"]).name.removesuffix(".ipynb")
    nb = NotebookRun(
        name,
        run_dir / name,
        str(entry.get("status", "ok")),
        entry.get("seconds"),
        entry.get("error"),
    )
    if nb.passed or (nb.folder / "metrics.json").exists():
        _attach_record(nb)
    return nb


def _from_folder(folder: Path) -> NotebookRun:
    """Without summary.json, a folder with metrics.json passed and one without it failed."""
    if not (folder / "metrics.json").exists():
        return NotebookRun(
            folder.name,
            folder,
            "failed",
            error=_(
                "{path}: missing (the notebook did not finish, and there "
                "is no summary.json to say why)"
            ).format(path=folder / "metrics.json"),
        )
    nb = NotebookRun(folder.name, folder, "ok")
    _attach_record(nb)
    nb.seconds = nb.record.get("seconds") if nb.record else None
    return nb


def load_run(run_dir: str | Path) -> Run:
    """Read a run folder: summary.json when present, plus any notebook folder it does not list."""
    path = Path(run_dir)
    if not path.is_dir():
        raise ReportError(
            _("{path}: not a run directory (expected runs/<timestamp>/ from make run)").format(
                path=path
            )
        )
    summary = read_summary(path)
    listed = (_from_summary(path, entry) for entry in summary.get("notebooks", []))
    notebooks = {nb.name: nb for nb in listed}
    for folder in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
        notebooks.setdefault(folder.name, _from_folder(folder))
    return Run(path, summary, notebooks)


def as_run(run: Run | str | Path) -> Run:
    return run if isinstance(run, Run) else load_run(run)
