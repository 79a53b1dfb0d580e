"""The one progress line the taught training scripts print, and its reader in the notebook.

A script started by torchrun cannot draw in the notebook: all it has is its standard output,
which the launcher streams back line by line with a ``[rankN]`` prefix. So every rank prints a
plain line every few steps, as readable in a terminal or a log file as in the notebook::

    progress: step 25/62, loss 0.3121, 812.3 samples/s

and the notebook (``helpers.live``) turns those lines into one bar per rank. The format lives
here and nowhere else: scripts call ``progress_line``, the notebook calls ``parse_progress``.
Importing this module costs nothing, so a worker can use it before torch is even loaded.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from helpers.messages import _  # light: gettext and the standard library

_LINE = re.compile(r"^progress: step (\d+)/(\d+), loss (\S+), (\S+) samples/s$")


@dataclass(frozen=True)
class Progress:
    """Where one rank is: ``step`` of ``total`` done, its last loss and its throughput."""

    step: int
    total: int
    loss: float
    samples_per_s: float  # NaN while the script's timer is still in its warm-up

    def describe(self) -> str:
        """The figures as a bar's label shows them: '25/62 steps · 812 samples/s · loss 0.312'."""
        rate = "…" if math.isnan(self.samples_per_s) else f"{self.samples_per_s:.0f}"
        text = _("{step}/{total} steps · {rate} samples/s · loss {loss:.4g}")
        return text.format(step=self.step, total=self.total, rate=rate, loss=self.loss)


def progress_line(step: int, total: int, loss: float, samples_per_s: float) -> str:
    """The line a training script prints (with ``flush=True``) every few steps."""
    if total < 1 or not 0 <= step <= total:
        raise ValueError(
            f"progress_line needs 0 <= step <= total and total >= 1, got step={step}, "
            f"total={total}: pass the steps done so far and the steps the run will take"
        )
    return f"progress: step {step}/{total}, loss {loss:.4f}, {samples_per_s:.1f} samples/s"


def parse_progress(text: str) -> Progress | None:
    """The figures of a progress line (without its ``[rankN]`` prefix); None for other lines."""
    match = _LINE.match(text.strip())
    if match is None:
        return None
    try:
        loss, rate = float(match[3]), float(match[4])
    except ValueError:
        return None
    return Progress(int(match[1]), int(match[2]), loss, rate)
