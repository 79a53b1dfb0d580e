"""The one progress line the taught scripts print, and its reader in the notebook.

A script started by torchrun cannot draw in the notebook: all it has is its standard output,
which the launcher streams back line by line with a ``[rankN]`` prefix. So every rank prints a
plain line every few steps, as readable in a terminal or a log file as in the notebook::

    progress: step 25/62, loss 0.3121, 812.3 samples/s
    progress: step 2/3                             (a benchmark: no loss, no throughput)
    progress: fsdp part 1/4                        (a job of parts: the one just done)

and the notebook (``helpers.live``) turns those lines into one bar per rank. The format lives
here and nowhere else: scripts call ``progress_line``, the notebook calls ``parse_progress``.
Importing this module costs nothing, so a worker can use it before torch is even loaded.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from helpers.messages import _  # light: gettext and the standard library

RANK_TAG = re.compile(r"^\[rank(\d+)\] ")  # the launcher's prefix: which rank printed a line
_LABEL = re.compile(r"[\w.+-]+")
UNITS = ("step", "part")  # what the count counts: training steps, or the parts of a lab job
_LINE = re.compile(
    r"^progress: (?:(?P<label>[\w.+-]+) )?(?P<unit>step|part) (?P<step>\d+)/(?P<total>\d+)"
    r"(?:, loss (?P<loss>\S+?))?(?:, (?P<rate>\S+) samples/s)?$"
)


@dataclass(frozen=True)
class Progress:
    """Where one rank is: ``step`` of ``total`` done, and what the script reported with it."""

    step: int
    total: int
    loss: float | None = None  # None: the script reports no loss (a benchmark, say)
    samples_per_s: float | None = None  # NaN while the script's timer is still in its warm-up
    label: str = ""  # names what the count is at: the part just done ("fsdp"), else ""
    unit: str = "step"  # one of UNITS

    def describe(self) -> str:
        """The figures as a bar's label shows them: '25/62 steps · 812 samples/s · loss 0.312'."""
        parts = [self.label] if self.label else []
        count = _("{step}/{total} parts") if self.unit == "part" else _("{step}/{total} steps")
        parts.append(count.format(step=self.step, total=self.total))
        if self.samples_per_s is not None:
            rate = "…" if math.isnan(self.samples_per_s) else f"{self.samples_per_s:.0f}"
            parts.append(_("{rate} samples/s").format(rate=rate))
        if self.loss is not None:
            parts.append(_("loss {loss:.4g}").format(loss=self.loss))
        return " · ".join(parts)


def progress_line(
    step: int,
    total: int,
    loss: float | None = None,
    samples_per_s: float | None = None,
    label: str = "",
    unit: str = "step",
) -> str:
    """The line a script prints (with ``flush=True``) every few steps, on every rank.

    A job that runs several parts (a timing sweep, a pipeline's schedules) prints one per part
    done, with ``unit="part"`` and the part's name as ``label``.
    """
    if total < 1 or not 0 <= step <= total:
        raise ValueError(
            f"progress_line needs 0 <= step <= total and total >= 1, got step={step}, "
            f"total={total}: pass the steps done so far and the steps the run will take"
        )
    if label and not _LABEL.fullmatch(label):
        raise ValueError(f"progress_line label {label!r}: one word (letters, digits, ._+-)")
    if unit not in UNITS:
        raise ValueError(f"progress_line unit {unit!r}: one of {', '.join(UNITS)}")
    line = f"progress: {label + ' ' if label else ''}{unit} {step}/{total}"
    if loss is not None:
        line += f", loss {float(loss):.4f}"
    if samples_per_s is not None:
        line += f", {samples_per_s:.1f} samples/s"
    return line


def parse_progress(text: str) -> Progress | None:
    """The figures of a progress line (without its ``[rankN]`` prefix); None for other lines."""
    match = _LINE.match(text.strip())
    if match is None:
        return None
    try:
        loss = None if match["loss"] is None else float(match["loss"])
        rate = None if match["rate"] is None else float(match["rate"])
    except ValueError:
        return None
    step, total = int(match["step"]), int(match["total"])
    return Progress(step, total, loss, rate, match["label"] or "", match["unit"])
