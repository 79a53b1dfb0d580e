"""The record every notebook leaves: ``out_dir/metrics.json`` plus its figures as PNG.

Metric names are the interface the report, the tests and users' dashboards read, so the
record's shape lives here once (see DESIGN.md, "The record every notebook leaves").
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from helpers.env import hardware_summary
from helpers.messages import _


def _jsonable(value: Any) -> Any:
    """Plain JSON: tensors and numpy scalars become numbers, NaN/inf become null."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


class Record:
    """Collects a notebook's hardware, parameters, metrics and skips; writes them at the end."""

    def __init__(
        self,
        notebook: str,
        out_dir: str | Path,
        params: dict[str, Any],
        plan: dict[str, Any] | None = None,
    ):
        """``plan``: the lesson's own ``device_plan`` when it differs from the machine's default
        (e.g. 2 CPU ranks on a 1-GPU machine); it is kept in the hardware block with its why."""
        self.notebook = notebook
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.params = dict(params)
        self.hardware = hardware_summary()
        if plan is not None:
            self.hardware["lesson_plan"] = dict(plan)
        self.metrics: dict[str, Any] = {}
        self.skipped: list[dict[str, str]] = []
        self._start = time.perf_counter()

    def skip(self, what: str, why: str) -> None:
        """Say loudly that part of the lesson did not run here, and keep it in the record."""
        print(_("SKIPPED: {what} -- {why}").format(what=what, why=why))
        self.skipped.append({"what": what, "why": why})

    def figure(self, fig: Any, name: str) -> Path:
        """Save a matplotlib figure next to metrics.json (it still shows inline)."""
        path = self.out_dir / f"{name}.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        return path

    def add(self, **metrics: Any) -> None:
        """Keep metrics in the cell that computes them; ``write`` saves them all at the end."""
        self.metrics.update(metrics)

    def write(self, **metrics: Any) -> None:
        """Write metrics.json, with every exercise's verdict; the lesson's last line, once
        (returns nothing, so the cell shows only the printed line)."""
        from helpers import exercise  # the verdicts of this kernel's exercise checks

        self.metrics.update(metrics, exercises=exercise.summary())
        record = {
            "notebook": self.notebook,
            "hardware": self.hardware,
            "params": self.params,
            "metrics": self.metrics,
            "skipped": self.skipped,
            "seconds": round(time.perf_counter() - self._start, 3),
        }
        path = self.out_dir / "metrics.json"
        path.write_text(json.dumps(_jsonable(record), indent=2) + "\n")
        line = _("Wrote {path} ({metrics} metrics, {skipped} skipped)")
        print(line.format(path=path, metrics=len(self.metrics), skipped=len(self.skipped)))


def load(path: str | Path) -> dict[str, Any]:
    """Read a metrics.json, naming the file in the error when it is missing or corrupt."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.json"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: no metrics.json here (did the notebook finish?)"
        ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); re-run the notebook") from None
    missing = {"notebook", "hardware", "params", "metrics", "skipped", "seconds"} - set(record)
    if missing:
        raise ValueError(f"{path}: missing keys {sorted(missing)}; re-run the notebook")
    return record
