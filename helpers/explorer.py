"""Explorers: a few controls that redraw a figure the lesson's own functions compute.

Where a lesson is a trade-off (the pipeline bubble against the number of micro-batches, memory
per rank against the world size, DataLoader knobs against throughput), moving a slider teaches
more than one more table. An explorer is a function the notebook writes, ``render(**values)``
returning ``(figure, summary)`` from the lesson's real code, plus the widgets that feed it:

    explore(pipeline_view, stages=IntSlider(2, min=2, max=8), microbatches=IntSlider(4, ...))

In JupyterLab every change of a control redraws the figure (sent as a PNG) and the one-line
summary under it. Headless (papermill, nbval) nothing would draw the widgets, so ``render`` runs
once with the controls' starting values and the summary is printed: the cell still leaves a
result in the executed notebook.

Build the figure with ``matplotlib.figure.Figure`` rather than ``plt.subplots``: pyplot would
also show every redrawn figure below the cell and keep them all in memory.
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable
from typing import Any

from helpers.frontend import widgets_shown

Render = Callable[..., tuple[Any, str]]  # (a matplotlib Figure, a one-line summary)


def figure_png(fig: Any, dpi: int = 80) -> bytes:
    """The figure as PNG bytes, and the figure closed if pyplot was keeping it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    if getattr(fig, "number", None) is not None:  # made by pyplot: let it go
        import matplotlib.pyplot as plt

        plt.close(fig)
    return buffer.getvalue()


class Explorer:
    """Controls, the figure and summary they produce, and the last values drawn."""

    def __init__(self, render: Render, controls: dict[str, Any], interactive: bool):
        if not controls:
            raise ValueError("explore() needs at least one control, e.g. stages=IntSlider(...)")
        self.render = render
        self.controls = controls
        self.renders = 0
        self.summary, self.png = self._draw()
        self.box = self._widgets() if interactive else None

    @property
    def values(self) -> dict[str, Any]:
        return {name: control.value for name, control in self.controls.items()}

    def _draw(self) -> tuple[str, bytes]:
        fig, summary = self.render(**self.values)
        self.renders += 1
        return summary, figure_png(fig)

    def _widgets(self) -> Any:
        import ipywidgets as widgets

        self.image = widgets.Image(
            value=self.png, format="png", layout=widgets.Layout(max_width="100%")
        )
        self.caption = widgets.HTML(self._caption(self.summary))
        for control in self.controls.values():
            if hasattr(control, "continuous_update"):
                control.continuous_update = False  # redraw when the slider is let go
            control.observe(self._changed, names="value")
        box = widgets.VBox(
            [
                widgets.HBox(
                    list(self.controls.values()), layout=widgets.Layout(flex_flow="row wrap")
                ),
                self.image,
                self.caption,
            ]
        )
        box.add_class("mgl-explorer")
        return box

    @staticmethod
    def _caption(text: str, style: str = "") -> str:
        return f'<div class="mgl-summary" style="{style}">{html.escape(text)}</div>'

    def _changed(self, _change: Any) -> None:
        """A control moved: say so, recompute, redraw; a failure is shown, not swallowed."""
        self.caption.value = self._caption(f"… computing for {self.values}", "opacity:0.6")
        try:
            self.summary, self.png = self._draw()
        except Exception as exc:  # shown under the figure: the callback's traceback is hidden
            self.caption.value = self._caption(
                f"Could not compute {self.values}: {type(exc).__name__}: {exc}", "color:#c00"
            )
            return
        self.image.value = self.png
        self.caption.value = self._caption(self.summary)


def explore(render: Render, **controls: Any) -> Explorer:
    """Show ``render``'s figure and summary under ``controls``; headless, print the summary."""
    interactive = widgets_shown()
    explorer = Explorer(render, controls, interactive)
    if interactive:
        from IPython.display import display

        display(explorer.box)
    else:
        print(explorer.summary)
    return explorer
