"""The notebooks in a real JupyterLab, in a real browser, run as a learner runs them.

JupyterLab serves a throwaway folder holding quick-mode copies of the notebooks; headless
Chromium (Debian's package, installed by scripts/install-chromium.sh) opens each one, runs
all cells from the menu and waits. A notebook passes when no cell raised, every cell ran,
tqdm's progress bars rendered as widgets and are still there at the end, and the plots
appeared. Then the widgets of issue 20 are counted: one explorer per ``explore(...)`` call,
each answering a moved slider (or toggle) with a new figure, and one live view per cell that
starts a torchrun job, whose bars per rank keep their final figures. A screenshot of each is
kept in runs/browser/ (or $MULTIGPU_LAB_BROWSER_OUT). A deliberately broken notebook
(tests/fixtures/broken.ipynb) must fail the same checks: the test of the test; and a job
stopped with its Stop button (tests/fixtures/live_stop.ipynb) must end with nothing left.

Which notebooks: 00 and 01, and any notebook whose notebooks/catalog.json entry says
``"browser": true`` (``false`` opts one out). Without Chromium the tests are skipped, except
in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from browser_lab import (
    WIDGET_VIEW,
    NotebookRun,
    chromium_page,
    drawable,
    find_chromium,
    output_folder,
    prepare_copy,
    press_stop_when_ranks_report,
    run_notebook,
    running_lab,
    uses_tqdm,
)

from helpers import env
from labtools import i18n, runner

DEFAULT_PREFIXES = ("00_", "01_")  # in the browser test unless the catalog says otherwise
FIXTURE = Path(__file__).parent / "fixtures" / "broken.ipynb"
STOP_FIXTURE = Path(__file__).parent / "fixtures" / "live_stop.ipynb"
LAUNCH = re.compile(r"\blaunch\.(torchrun|Job)\(")
# Notebooks whose torchrun job prints progress lines (ddp_train.py): a bar per rank must stay.
RANK_BARS = {"02_distributed_data_parallel", "03_mixed_precision"}
FIXTURE_TIMEOUT_S = 90
DEFAULT_TIMEOUT_S = 240  # for a notebook not (yet) in the catalog


def browser_stems() -> list[str]:
    """Existing notebooks to open in the browser, in lesson order."""
    marked = {e["stem"]: e.get("browser") for e in runner.catalog()}

    def wanted(stem: str) -> bool:
        flag = marked.get(stem)
        return stem.startswith(DEFAULT_PREFIXES) if flag is None else bool(flag)

    return [stem for stem in runner.notebook_stems() if wanted(stem)]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def budget(stem: str) -> float:
    try:
        return float(runner.catalog_entry(stem)["timeout_quick_s"])
    except KeyError:
        return DEFAULT_TIMEOUT_S


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's Chromium and Playwright, or a skip (a failure in CI) saying how to get them."""
    executable = find_chromium()
    why = None
    if executable is None:
        why = (
            "no Chromium found: run `scripts/install-chromium.sh` (apt-get install chromium) "
            "or set MULTIGPU_LAB_CHROMIUM=/path/to/chromium"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        why = "the playwright package is missing: `make setup` installs the dev extras"
    if why:
        if in_ci():
            pytest.fail(f"CI=true and {why}")
        pytest.skip(why)
    return executable


@pytest.fixture(scope="module")
def lab(chromium, tmp_path_factory):
    """JupyterLab serving a throwaway root; it and every kernel end after the module."""
    base = tmp_path_factory.mktemp("browser")
    (base / "root").mkdir()
    try:
        with running_lab(base / "root", base / "state") as server:
            yield server
    finally:  # the server's log next to the screenshots, for whoever reads a failure
        logs = sorted((base / "state").glob("server-*.log"))
        if logs:
            out = output_folder(runner.REPO_ROOT)
            out.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(logs[-1], out / "jupyterlab.log")


@pytest.fixture(scope="module")
def page(chromium, lab):
    with chromium_page(chromium) as browser_page:
        yield browser_page


def open_and_run(
    lab, page, source: Path, timeout: float, during=None, folder: str = "notebooks"
) -> tuple[NotebookRun, Path]:
    """Copy one notebook into the lab's ``folder`` in quick mode, run it in the browser; the
    run and where its record should land."""
    out_dir = lab.root / "out" / folder / source.stem
    prepare_copy(source, lab.root / folder, out_dir, runner.kernel_name())
    shots = output_folder(runner.REPO_ROOT)
    run = run_notebook(
        page,
        lab,
        f"{folder}/{source.name}",
        shots if folder == "notebooks" else shots / folder,
        timeout=timeout,
        during=during,
    )
    return run, out_dir


def expected_widgets(nb: nbformat.NotebookNode) -> dict[str, int]:
    """What the kernel's code asks to show: an explorer per ``explore(`` call, and a live view
    in each cell that starts a torchrun job (a script a cell writes runs elsewhere)."""
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    code = [src for src in code if not src.lstrip().startswith("%%writefile")]
    return {
        "explorers": sum(src.count("explore(") for src in code),
        "cells with a live job": sum(bool(LAUNCH.search(src)) for src in code),
    }


def shown_widgets(run: NotebookRun) -> dict[str, int]:
    return {
        "explorers": run.count("explorers"),
        "cells with a live job": sum(bool(c["live"]) for c in run.cells),
    }


def describe(run: NotebookRun, problems: list[str]) -> str:
    lines = [f"{run.name} in the browser ({run.seconds:.0f} s), screenshot {run.screenshot}:"]
    lines += [f"  - {p}" for p in problems]
    if run.page_errors:
        lines.append("  page errors: " + "; ".join(run.page_errors[:5]))
    return "\n".join(lines)


@pytest.mark.browser
@pytest.mark.parametrize("stem", browser_stems())
def test_notebook_runs_all_in_jupyterlab(stem, lab, page):
    run, out_dir = open_and_run(lab, page, runner.NOTEBOOKS / f"{stem}.ipynb", budget(stem))
    problems = run.problems(expect_kernel=runner.kernel_name())
    assert not problems, describe(run, problems)
    assert not lab.children(), "the notebook's kernel (or a worker) is still running"
    assert run.screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads((out_dir / "metrics.json").read_text())
    assert record["params"]["quick"] is True, "the copy ran in quick mode"
    source = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    assert shown_widgets(run) == expected_widgets(source), describe(run, ["widgets counted"])
    for moved in run.explorers:  # each explorer's first control, moved as a learner would
        assert moved["after"] != moved["before"], f"no new summary after moving: {moved}"
        assert moved["image_changed"], f"the figure did not change: {moved}"
    if stem in RANK_BARS:
        assert run.count("rank_bars") >= env.device_plan()["nproc"], run.cells


EDITION, EDITION_STEM = "zh_CN", "00_environment"  # the Chinese edition's first lesson
# What its helpers say in Chinese on any machine: the run folder and the exercises' verdicts
# (the live view of its all-reduce job is checked too).
CHINESE_OUTPUT = ("本次运行的文件夹", "✅ 练习 00.1：正确", "✅ 练习 00.2：正确")


@pytest.mark.browser
def test_the_chinese_edition_speaks_chinese_in_jupyterlab(lab, page, tmp_path):
    """The zh_CN notebook, copied into a folder named like no edition (``course/``) and run
    from the menu: its kernel knows the edition from the notebook it serves, so the helpers
    and the live view answer in Chinese, and the browser has the fonts to draw them."""
    fonts = drawable(page, ["中", "练", "✅", "🚀", "\U0001e900"])
    assert fonts["中"] and fonts["练"], f"no CJK font: run scripts/install-chromium.sh ({fonts})"
    assert fonts["✅"] and fonts["🚀"], f"no emoji font: run scripts/install-chromium.sh ({fonts})"
    assert not fonts["\U0001e900"], "the glyph check must see a missing font (Adlam has none)"
    source = i18n.edition_path(EDITION, EDITION_STEM, tmp_path / "built")
    run, out_dir = open_and_run(lab, page, source, budget(EDITION_STEM), folder="course")
    problems = run.problems(expect_kernel=runner.kernel_name())
    assert not problems, describe(run, problems)
    assert not lab.children(), "the notebook's kernel (or a worker) is still running"
    shown = "\n".join(c["text"] for c in run.cells)
    missing = [text for text in CHINESE_OUTPUT if text not in shown]
    assert not missing, describe(run, [f"not shown in Chinese: {missing}"])
    statuses = [s for c in run.cells for s in c["live"]]
    assert statuses and all("✓ 已完成，用时" in s for s in statuses), statuses
    assert json.loads((out_dir / "metrics.json").read_text())["params"]["quick"] is True


@pytest.mark.browser
def test_a_broken_notebook_fails_the_browser_check(lab, page):
    run, _ = open_and_run(lab, page, FIXTURE, FIXTURE_TIMEOUT_S)
    problems = run.problems(expect_kernel=runner.kernel_name())
    text = describe(run, problems)
    assert run.finished, text
    assert any(p.startswith("cell 4 raised KeyError") for p in problems), text
    assert any(p.startswith("cell 4 shows a traceback on the page") for p in problems), text
    assert "cells [5] never ran" in problems, text
    assert len(problems) == 3, text  # and nothing else: the bar and the plot did render
    assert sum(c["progress"] for c in run.cells) == 1, "tqdm.auto rendered as a widget"
    assert sum(c["images_shown"] for c in run.cells) == 1, "the plot appeared"
    assert run.screenshot.exists()
    assert not lab.children(), "the notebook's kernel (or a worker) is still running"


@pytest.mark.browser
def test_stop_button_ends_a_running_job_in_jupyterlab(lab, page):
    """Clicked while the cell still runs (the kernel serves it on a subshell): the job ends,
    its bars stay, and the next cell finds no worker left."""
    run, _ = open_and_run(
        lab, page, STOP_FIXTURE, FIXTURE_TIMEOUT_S, during=press_stop_when_ranks_report(2)
    )
    text = describe(run, run.problems())
    assert run.finished, text
    assert run.problems() == ["no plot appeared in any output"], text  # it draws none
    errors = [o for o in run.model.cells[4].outputs if o.output_type == "error"]
    assert errors and errors[0].ename == "JobStopped", text
    assert run.cells[4]["live"][0].split(" · ")[1].startswith("✗ stopped"), run.cells[4]
    assert len(run.cells[4]["rank_bars"]) == 2, "the bars stay after Stop"
    assert all("3/10 steps" in bar for bar in run.cells[4]["rank_bars"]), run.cells[4]
    assert "processes left by the stopped job: []" in run.cells[5]["text"], run.cells[5]
    assert not lab.children(), "the notebook's kernel (or a worker) is still running"


def fake_run(**overrides) -> NotebookRun:
    """A run as the browser would report it, to test the checks without a browser."""
    cell = nbformat.v4.new_code_cell("from tqdm.auto import tqdm", execution_count=1)
    seen = {
        "code": True,
        "prompt": "[1]:",
        "text": "",
        "progress": 1,
        "widgets": 3,
        "images": 1,
        "images_shown": 1,
        "explorers": 0,
        "live": [],
        "rank_bars": [],
    }
    values = {
        "name": "fake",
        "seconds": 1.0,
        "finished": True,
        "uses_tqdm": True,
        "cells": [seen],
        "model": nbformat.v4.new_notebook(cells=[cell]),
        "screenshot": Path("fake.png"),
        "kernel": "k",
    }
    values.update(overrides)
    return NotebookRun(**values)


def test_checks_pass_a_clean_run():
    assert fake_run().problems(expect_kernel="k") == []


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        ({"progress": 0, "widgets": 0}, "no progress bar rendered"),
        ({"text": "Error displaying widget: model not found"}, "a widget failed to render"),
        ({"images_shown": 0}, "did not load"),
        ({"prompt": "[*]:"}, "still shows [*]"),
        ({"text": "NameError      Traceback (most recent call last)"}, "traceback on the page"),
    ],
)
def test_checks_catch_what_a_learner_would_see(seen, expected):
    run = fake_run()
    run.cells[0].update(seen)
    assert any(expected in p for p in run.problems()), run.problems()


def test_checks_count_tqdm_bars_and_know_where_tqdm_runs():
    text = "x:  50%|#####     | 1/2 [00:01<00:01]"  # tqdm's text form of the widget
    bar = nbformat.v4.new_output("display_data", data={WIDGET_VIEW: {}, "text/plain": text})
    run = fake_run()
    run.model.cells[0].outputs = [bar, bar]
    assert any("2 tqdm bar(s), 1 rendered" in p for p in run.problems())
    script = nbformat.v4.new_code_cell("%%writefile work/t.py\nfrom tqdm import tqdm")
    kernel = nbformat.v4.new_code_cell("x = 1\nfrom tqdm.auto import tqdm")
    assert not uses_tqdm(nbformat.v4.new_notebook(cells=[script]))
    assert uses_tqdm(nbformat.v4.new_notebook(cells=[script, kernel]))


def test_checks_catch_a_timeout_the_wrong_kernel_and_an_unsaved_model():
    assert any("did not finish" in p for p in fake_run(finished=False).problems())
    assert any("expected 'k'" in p for p in fake_run(kernel="python3").problems("k"))
    assert any("did not save" in p for p in fake_run(model=None).problems())


def test_checks_catch_a_vanished_bar_and_a_live_view_left_wrong():
    text = "x: 100%|##########| 2/2 [00:01<00:00]"
    bar = nbformat.v4.new_output("display_data", data={WIDGET_VIEW: {}, "text/plain": text})
    run = fake_run()
    run.model.cells[0].outputs = [bar]
    run.cells[0]["progress_end"] = 0  # shown while the loop ran, gone at the end: leave=False
    assert any("left on screen at the end" in p for p in run.problems())
    run = fake_run()
    run.cells[0]["live"] = ["torchrun t.py (2 x cpu) · running · 9 s"]
    assert any("still says running" in p for p in run.problems())
    run = fake_run()
    run.cells[0]["live"] = ["torchrun t.py (2 x cpu) · ✓ finished after 9.0 s"]
    run.cells[0]["rank_bars"] = ["rank 0 62/62 steps · 9 samples/s", "rank 1 60/62 steps"]
    assert any("lost their final figures" in p for p in run.problems())
    run.cells[0]["rank_bars"] = ["rank 0 62/62 steps · 9 samples/s"] * 2
    assert run.problems() == []


def test_widgets_expected_from_the_notebook_source():
    cells = [
        nbformat.v4.new_code_cell(src)
        for src in (
            "%%writefile work/x.py\nlaunch.torchrun('y')",  # a script: runs elsewhere
            "r = launch.torchrun('work/x.py')",
            "job = launch.Job('work/x.py')",
            "e = explore(view, s=IntSlider())",
        )
    ]
    counts = expected_widgets(nbformat.v4.new_notebook(cells=cells))
    assert counts == {"explorers": 1, "cells with a live job": 2}
