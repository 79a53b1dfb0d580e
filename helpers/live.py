"""A torchrun job, live in the cell that waits for it: a bar per rank, coloured logs, Stop.

``helpers.launch`` streams the ranks' output into the cell. In JupyterLab this module shows it
the way a training job is worth watching: one progress bar per rank, moved by the ``progress:``
lines every rank prints (``helpers.progress``) and labelled with its steps, samples/s and loss;
every other line in a log below, in its rank's colour; and a Stop button that ends torchrun and
every worker, as the kernel's interrupt does. The bars stay on screen, with their last figures,
once the job is over.

Headless (papermill, nbval, pytest) nothing would draw widgets, so ``TextView`` prints the log
lines as they arrive and, at the end, the last progress of each rank.
"""

from __future__ import annotations

import html
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from helpers.frontend import widgets_shown
from helpers.messages import _
from helpers.progress import RANK_TAG, Progress, parse_progress

# matplotlib's tab10: rank r's colour is the same in the bars, the log and the lessons' plots
RANK_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
LOG_STYLE = "max-height:16em;overflow-y:auto;display:flex;flex-direction:column-reverse"


def rank_color(rank: int | None) -> str:
    """Rank ``rank``'s colour; the launcher's own lines (no rank) are grey."""
    return "#666666" if rank is None else RANK_COLORS[rank % len(RANK_COLORS)]


def status_text(status: str) -> str:
    """How a job ended, in the reader's language; the launcher and the ledger keep the English
    word (``finished``, ``failed (exit code 1)``, ``timed out (60 s limit)``, ...)."""
    if found := re.fullmatch(r"failed \(exit code (-?\d+)\)", status):
        return _("failed (exit code {code})").format(code=found[1])
    if found := re.fullmatch(r"timed out \((\d+) s limit\)", status):
        return _("timed out ({limit} s limit)").format(limit=found[1])
    words = {
        "running": _("running"),
        "finished": _("finished"),
        "stopped": _("stopped"),
        "interrupted": _("interrupted"),
    }
    return words.get(status, status)


def split_rank(line: str) -> tuple[int | None, str]:
    """``'[rank1] text'`` -> ``(1, 'text')``; a line of torchrun itself -> ``(None, line)``."""
    tag = RANK_TAG.match(line)
    return (int(tag[1]), line[tag.end() :]) if tag else (None, line)


class TextView:
    """Headless: log lines printed as they arrive, then the last progress of each rank."""

    def __init__(self, title: str):
        self.title = title
        self.ranks: dict[int, Progress] = {}  # each rank's last progress line
        self.status: str | None = None  # set once, by finish()

    def progress(self, line: str) -> bool:
        """Take a ``[rankN] progress: ...`` line; False for any other line (it is log)."""
        rank, text = split_rank(line)
        found = parse_progress(text) if rank is not None else None
        if found is None:
            return False
        self.ranks[rank] = found
        self._moved(rank, found)
        return True

    def show(self, lines: list[str]) -> None:
        """Log lines, in one write: one message per batch keeps the notebook responsive."""
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()

    def finish(self, status: str, seconds: float) -> None:
        """The job is over (``status``: finished, stopped, failed ...); the first call counts."""
        if self.status is None:
            self.status = status
            self._finished(seconds)

    def summary(self, seconds: float) -> list[str]:
        if not self.ranks:
            return []
        head = _("{title}: {status} after {seconds:.1f} s; last progress per rank:")
        lines = [
            head.format(title=self.title, status=status_text(self.status or ""), seconds=seconds)
        ]
        return lines + [
            "  " + _("rank {rank}").format(rank=r) + f": {p.describe()}"
            for r, p in sorted(self.ranks.items())
        ]

    def tick(self) -> None:
        """Time passes while the job runs (the live view shows it)."""

    def _moved(self, rank: int, progress: Progress) -> None:
        """A rank reported progress (the live view moves its bar)."""

    def _finished(self, seconds: float) -> None:
        if lines := self.summary(seconds):
            print("\n".join(lines))


class LiveView(TextView):
    """JupyterLab: Stop button and status, one bar per rank, the rank-coloured log."""

    def __init__(self, title: str, on_stop: Callable[[], None]):
        super().__init__(title)
        import ipywidgets as widgets
        from IPython.display import display

        self._widgets = widgets
        self._on_stop = on_stop
        self._started = time.monotonic()
        self._ticked = 0.0
        self.stop_button = widgets.Button(
            description=_("Stop"),
            icon="stop",
            button_style="danger",
            tooltip=_("End torchrun and every worker now (the kernel's interrupt does the same)"),
        )
        self.stop_button.on_click(self._stop_clicked)
        self.header = widgets.HTML(self._header("running"))
        self.header.add_class("mgl-status")
        self.bars: dict[int, tuple[Any, Any]] = {}  # rank -> (IntProgress, HTML label)
        self.rows: dict[int, Any] = {}  # rank -> the HBox holding them
        self.bar_box = widgets.VBox([])
        self.log_lines: list[str] = []
        self.log = widgets.HTML("")
        self.box = widgets.VBox(
            [widgets.HBox([self.stop_button, self.header]), self.bar_box, self.log]
        )
        self.box.add_class("mgl-live")
        display(self.box)
        answer_while_busy(self.stop_button)

    def _header(self, state: str) -> str:
        seconds = time.monotonic() - self._started
        said = html.escape(status_text(state))
        return f"<b>{html.escape(self.title)}</b> · {said} · " + _("{seconds:.0f} s").format(
            seconds=seconds
        )

    def tick(self) -> None:
        """The elapsed time in the header, at most once a second."""
        now = time.monotonic()
        if self.status is None and now - self._ticked >= 1.0:
            self._ticked = now
            self.header.value = self._header("running")

    def _moved(self, rank: int, progress: Progress) -> None:
        if rank not in self.bars:
            self._add_bar(rank)
        bar, label = self.bars[rank]
        bar.max = progress.total  # the max first: a value above it would be clipped
        bar.value = progress.step
        label.value = progress.describe()
        self.tick()

    def _add_bar(self, rank: int) -> None:
        w = self._widgets
        bar = w.IntProgress(
            value=0,
            min=0,
            max=1,
            description=_("rank {rank}").format(rank=rank),
            style={"bar_color": rank_color(rank)},
        )
        label = w.HTML("")
        row = w.HBox([bar, label])
        row.add_class("mgl-rank-bar")
        self.bars[rank] = (bar, label)
        self.rows[rank] = row
        self.bar_box.children = tuple(self.rows[r] for r in sorted(self.rows))

    def show(self, lines: list[str]) -> None:
        for line in lines:
            rank, text = split_rank(line)
            who = "" if rank is None else f"[rank{rank}] "
            self.log_lines.append(
                f'<span style="color:{rank_color(rank)}">{html.escape(who + text)}</span>'
            )
        body = "\n".join(self.log_lines)
        self.log.value = f'<div style="{LOG_STYLE}"><pre style="margin:0">{body}</pre></div>'
        self.tick()

    def _finished(self, seconds: float) -> None:
        mark = "✓" if self.status == "finished" else "✗"
        ended = _("{status} after {seconds:.1f} s").format(
            status=status_text(self.status or ""), seconds=seconds
        )
        self.header.value = f"<b>{html.escape(self.title)}</b> · {mark} {html.escape(ended)}"
        self.stop_button.disabled = True
        self.stop_button.button_style = ""  # no longer a red call to action
        self.stop_button.description = _("Stopped") if self.status == "stopped" else _("Done")

    def _stop_clicked(self, _button: Any) -> None:
        """Runs in the kernel's subshell thread: ask the waiting cell to stop the job."""
        self.stop_button.description = _("Stopping…")
        self.stop_button.disabled = True
        self._on_stop()


def answer_while_busy(widget: Any) -> None:
    """Let ``widget``'s messages reach the kernel while the cell that made it still runs.

    JupyterLab (4.4 on) sends widget messages on a kernel subshell, which ipykernel (7 on) serves
    in a thread of its own, so a click is handled while the main thread waits for torchrun. But
    ipykernel 7.4 routes a comm's messages to the shell that last sent on it, for a widget made
    in a cell the busy main shell; forgetting that choice sends the click to the subshell again.
    Without subshells (older kernels, other front ends) the click waits for the cell to end, and
    the kernel's interrupt button stops the job instead.
    """
    getattr(getattr(widget, "comm", None), "__dict__", {}).pop("_reply_subshell_id", None)


def view_for(title: str, on_stop: Callable[[], None]) -> TextView:
    """The live view where widgets are drawn, else the printed one."""
    return LiveView(title, on_stop) if widgets_shown() else TextView(title)
