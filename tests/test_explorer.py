"""Explorers: headless they print the summary once; live, every control change redraws."""

from __future__ import annotations

import ipywidgets as widgets
import pytest
from matplotlib.figure import Figure

from helpers import explorer, frontend


def bubble_view(stages: int, microbatches: int):
    """A tiny render function of the kind the notebooks write."""
    share = (stages - 1) / (microbatches + stages - 1)
    fig = Figure(figsize=(3, 2))
    fig.subplots().bar(["busy", "idle"], [1 - share, share])
    return fig, f"S={stages}, M={microbatches}: bubble {share:.1%}"


def controls():
    return {
        "stages": widgets.IntSlider(2, min=2, max=8),
        "microbatches": widgets.IntSlider(4, min=1, max=32),
    }


def test_headless_explore_prints_the_summary_of_the_starting_values(monkeypatch, capsys):
    monkeypatch.setenv(frontend.ENV, "0")
    found = explorer.explore(bubble_view, **controls())
    assert capsys.readouterr().out == "S=2, M=4: bubble 20.0%\n"
    assert found.renders == 1 and found.box is None
    assert found.png.startswith(b"\x89PNG")


def test_moving_a_slider_redraws_figure_and_summary():
    found = explorer.Explorer(bubble_view, controls(), interactive=True)
    before = found.image.value
    assert not found.controls["stages"].continuous_update, "redraw on release, not per pixel"
    found.controls["microbatches"].value = 16
    assert found.renders == 2
    assert found.image.value != before
    assert "S=2, M=16: bubble 5.9%" in found.caption.value
    assert "mgl-explorer" in found.box._dom_classes


def test_a_failing_redraw_is_shown_under_the_figure():
    def fragile(stages: int):
        if stages > 3:
            raise ValueError("too many stages for this model")
        return bubble_view(stages, 4)

    found = explorer.Explorer(fragile, {"stages": widgets.IntSlider(2, min=2, max=8)}, True)
    before = found.image.value
    found.controls["stages"].value = 5
    assert "ValueError: too many stages for this model" in found.caption.value
    assert found.image.value == before, "the last good figure stays"


def test_an_explorer_needs_controls():
    with pytest.raises(ValueError, match="at least one control"):
        explorer.Explorer(bubble_view, {}, interactive=False)
