"""The headless harness: every notebook in notebooks/ is picked up without editing this file.

Each is executed once in quick mode (conftest.notebook_run), by the client tests/clients.py
names for it: papermill for most, nbval for the lessons with cells marked
``# NBVAL_CHECK_OUTPUT`` (compared with their recorded outputs), ``jupyter nbconvert --execute``
for one lesson as it is. Each run must pass as its client judges it (exit 0, so no cell holds
an error output: a lesson that shows a failure catches it and prints it), and its metrics.json
is checked against the record contract.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import clients
import nbformat
import pytest
from conftest import CLASSROOM, STUDENT_EDITIONS

from helpers import cell_scripts
from labtools import exported_scripts, i18n, ledger, runner

STEMS = runner.notebook_stems()
# The Chinese edition of the classroom's lessons runs in CI too: its second student follows
# it (conftest.STUDENT_EDITIONS), at no extra cost; `make run LANG=zh_CN` runs all of it.
EDITIONS = [pytest.param(s, None, id=s) for s in STEMS] + [
    pytest.param(s, lang, id=f"{lang}/{s}") for s in CLASSROOM for lang in STUDENT_EDITIONS if lang
]
MIN_SECONDS = 1.0  # a notebook that "ran" faster than this did not run its lesson


def test_there_are_notebooks():
    assert "00_environment" in STEMS


def test_catalog_lists_every_notebook_in_order():
    assert [e["stem"] for e in runner.catalog()] == STEMS


@pytest.mark.parametrize("stem", STEMS)
def test_every_lesson_points_forward(stem):
    """One "Next:" line per lesson, naming the lesson that follows (the last one: what to read
    after the kit), in both editions."""
    later = STEMS[STEMS.index(stem) + 1 :]
    for nb, word in (
        (i18n.read_english(stem), "Next"),
        (i18n.translated_notebook("zh_CN", stem), "下一"),
    ):
        lines = [
            line
            for c in nb.cells
            if c.cell_type == "markdown"
            for line in c.source.splitlines()
            if re.match(rf"{word}\S*[:：]", line)
        ]
        assert len(lines) == 1, f"{stem}: {lines}"
        if later:
            assert f"**{later[0][:2]} ·" in lines[0], f"{stem} should point to {later[0]}: {lines}"


@pytest.mark.parametrize("stem", STEMS)
def test_no_lesson_argues_with_a_text_the_reader_has_not_seen(stem):
    """A common mistake stands alone (what people write, what happens, the fix): no cell of
    either edition rebuts "the guide" (原教程) the lessons were once written against."""
    for nb, word in (
        (i18n.read_english(stem), r"\bguide\b"),
        (i18n.translated_notebook("zh_CN", stem), "原教程"),
    ):
        found = [c.id for c in nb.cells if re.search(word, c.source, re.IGNORECASE)]
        assert not found, f"{stem}: cells {found} mention {word!r}"


@pytest.mark.parametrize("stem", STEMS)
def test_committed_without_outputs(stem):
    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    dirty = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and (c.outputs or c.execution_count)
    ]
    assert not dirty, f"{stem}: cells {dirty} have stored outputs; clear them before committing"


@pytest.mark.parametrize("stem", STEMS)
def test_no_cell_is_allowed_to_fail(stem):
    """papermill 2.x fails a run on any error output, tag or not: nothing may rely on the tag."""
    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    tagged = [i for i, c in enumerate(nb.cells) if "raises-exception" in c.metadata.get("tags", [])]
    assert not tagged, f"{stem}: cells {tagged} tagged raises-exception; catch and print instead"


@pytest.mark.parametrize("stem", STEMS)
def test_reads_no_earlier_run(stem):
    """What a lesson shows comes from its own run, never from runs/latest of some other day."""
    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    readers = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and re.search(r"""runs/latest|["']latest["']""", c.source)
    ]
    assert not readers, f"{stem}: cells {readers} read an earlier run's record"


def papermill(stem: str, out: Path, *params: str) -> subprocess.CompletedProcess:
    """papermill's own command line, as a user or a scheduler types it."""
    argv = [
        sys.executable,
        "-m",
        "papermill",
        f"{stem}.ipynb",
        str(out / f"{stem}.ipynb"),
        "-p",
        "out_dir",
        str(out),
        *params,
    ]
    return subprocess.run(argv, cwd=runner.NOTEBOOKS, capture_output=True, text=True, timeout=300)


@pytest.mark.notebook
@pytest.mark.parametrize(
    ("params", "message"),
    [
        (("-p", "quick", "yes"), "parameter quick must be True or False, got 'yes' (str)"),
        (
            ("-p", "quick", "True", "-p", "epochs", "0"),
            "unknown parameter(s) epochs: this notebook accepts out_dir, quick",
        ),
    ],
)
def test_bad_parameters_stop_at_the_check_cell(tmp_path, params, message):
    proc = papermill("00_environment", tmp_path, *params)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    executed = nbformat.read(tmp_path / "00_environment.ipynb", as_version=4)
    failed = [
        c for c in executed.cells if any(o.output_type == "error" for o in c.get("outputs", []))
    ]
    assert len(failed) == 1 and "lesson.start(" in failed[0].source
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.notebook
@pytest.mark.parametrize("stem", clients.NBCONVERT)
def test_nbconvert_runs_a_lesson_as_is(stem, notebook_run):
    """`jupyter nbconvert --execute` (no parameter injection): the parameters cell is edited."""
    assert clients.client_of(stem) == "nbconvert"
    outcome = notebook_run(stem)
    assert outcome.status == "ok", outcome.error
    executed = nbformat.read(outcome.output, as_version=4)
    tags = [t for c in executed.cells for t in c.metadata.get("tags", [])]
    assert "parameters" in tags and "injected-parameters" not in tags
    assert record_complete(Path(outcome.out_dir) / "metrics.json")


def record_complete(path: Path) -> bool:
    from helpers import record

    rec = record.load(path)
    return rec["params"]["quick"] is True and bool(rec["metrics"])


@pytest.mark.parametrize("stem", STEMS)
def test_anatomy(stem):
    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    assert "What you will learn" in nb.cells[0].source
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "exactly one cell tagged 'parameters'"
    assert "out_dir" in params[0].source and "quick" in params[0].source
    assert nb.cells[-1].source.strip() == "rec.write()", "one line closes it: metrics.json"


@pytest.mark.notebook
@pytest.mark.parametrize(("stem", "lang"), EDITIONS)
def test_executes_headless_and_leaves_its_record(stem, lang, notebook_run, notebook_record):
    record = notebook_record(stem, lang)
    assert record["notebook"] == stem
    assert record["params"]["quick"] is True
    assert record["hardware"]["device"] in ("cpu", "cuda", "mps")
    assert record["seconds"] >= MIN_SECONDS, f"{stem} finished in {record['seconds']} s"
    for skip in record["skipped"]:
        assert skip["what"] and skip["why"], "every skip says what and why"
    executed = nbformat.read(notebook_run(stem, lang).output, as_version=4)
    unexecuted = [
        i
        for i, c in enumerate(executed.cells)
        if c.cell_type == "code" and c.execution_count is None
    ]
    assert not unexecuted, f"cells {unexecuted} of {stem} never ran"
    errors = [
        i
        for i, c in enumerate(executed.cells)
        if any(o.output_type == "error" for o in c.get("outputs", []))
    ]
    assert not errors, f"cells {errors} of {stem} hold an error output"
    figures = list(Path(notebook_run(stem, lang).out_dir).glob("*.png"))
    assert figures, f"{stem} saved no figure next to metrics.json"
    json.dumps(record)  # plain JSON all the way down


@pytest.mark.notebook
@pytest.mark.parametrize(("stem", "lang"), EDITIONS)
def test_leaves_no_process_behind(stem, lang, notebook_run):
    outcome = notebook_run(stem, lang)
    left = runner.leftover_processes(outcome.out_dir)
    assert not left, f"{stem} left processes running: {left}"


@pytest.mark.notebook
@pytest.mark.parametrize("stem", STEMS)
def test_every_script_a_lesson_wrote_is_its_cell(stem, notebook_run):
    """What a %%writefile cell wrote is what helpers.cell_scripts rebuilds from the lesson, byte
    for byte: later lessons, scripts/ and the exercises take the scripts from there."""
    out_dir = Path(notebook_run(stem).out_dir)
    for script in exported_scripts.written_scripts(stem):
        assert (out_dir / script).read_text() == cell_scripts.cell_script(stem, script), script


# A job over within seconds of torchrun's own start-up (about 6 s on 2 cores) has nothing for a
# bar to show: the headless summary reports it. Longer jobs must draw a bar per rank.
SHORT_S = 15
# Jobs over within a second or two of their start-up, so a bar would only flash: by script.
SHORT_JOBS = {
    "trouble_ports.py": "prints one line without importing torch (the port demos refuse it first)",
    "trouble_skew.py": "one evaluation step, then a report",
}


@pytest.mark.notebook
@pytest.mark.parametrize(("stem", "lang"), EDITIONS)
def test_every_job_draws_a_bar_for_each_rank(stem, lang, notebook_run):
    """Each finished torchrun job printed helpers.progress lines from every rank, so the live
    view moved a bar per rank (the ledger keeps which ranks did)."""
    jobs = ledger.read(notebook_run(stem, lang).out_dir)
    silent = [
        f"{j['script']} ({j['seconds']} s): bars for ranks {j['progress_ranks']} of {j['nproc']}"
        for j in jobs
        if j["status"] == "finished"
        and j["script"] not in SHORT_JOBS
        and float(j["seconds"]) >= SHORT_S
        and len(j["progress_ranks"]) < int(j["nproc"])
    ]
    assert not silent, f"{stem}: jobs without a progress bar per rank: {silent}"


CHECKED = [s for s in STEMS if clients.client_of(s) == "nbval"]


@pytest.mark.notebook
@pytest.mark.parametrize("stem", CHECKED)
def test_nbval_finds_the_recorded_outputs(stem, notebook_run):
    outcome = notebook_run(stem)
    assert outcome.status == "ok", outcome.error
    executed = nbformat.read(outcome.output, as_version=4)
    for cell in clients.checked_cells(executed):
        assert cell.outputs, f"nbval ran cell {cell.id} of {stem} but kept no output of it"


CHECKED_CELL = "# NBVAL_CHECK_OUTPUT\nprint('sorted:', sorted([2, 1]) == [1, 2], 'in 0.3 s')"


@pytest.mark.parametrize(
    ("stored", "passes"),
    [("sorted: True in 9.9 s\n", True), ("sorted: False in 0.3 s\n", False)],
    ids=["a timing differs", "a fact differs"],
)
def test_nbval_compares_what_the_sanitizer_keeps(tmp_path, stored, passes, no_orphans):
    """The test of the test: the same nbval run fails on a changed fact, not on a timing."""
    cell = nbformat.v4.new_code_cell(CHECKED_CELL, execution_count=1)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=stored)]
    path = tmp_path / "checked.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), path)
    report = clients.nbval(path, tmp_path, timeout=60)
    assert (report is None) == passes, report
    if not passes:
        assert "sorted: False" in report


# "notebook 02, Part 6", "notebook 13's section 4", "section 3 of notebook 03", "(Part 2)": a
# reference without a notebook number points into the notebook it stands in.
REFERENCE = re.compile(
    r"(?:[Nn]otebook (?P<before>\d{2})(?:'s|,)? \(?)?\b(?P<kind>[Ss]ection|[Pp]art)s? (?P<n>\d+)"
    r"(?: (?:of|in) notebook (?P<after>\d{2}))?"
)


def sections_and_parts(stem: str) -> dict[str, set[int]]:
    """The numbered headings (``## 3. …``) and script parts (``**Part 2: …**``) a lesson has."""
    text = "\n".join(
        "".join(c.source)
        for c in nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4).cells
        if c.cell_type == "markdown"
    )
    return {
        "section": {int(n) for n in re.findall(r"(?m)^#{2,3} (\d+)\.", text)},
        "part": {int(n) for n in re.findall(r"\*\*Part (\d+)", text)},
    }


def test_every_section_and_part_reference_resolves():
    """A "see Part 8" that points at nothing sends a learner looking for a text not there."""
    by_number = {stem[:2]: stem for stem in STEMS}
    have = {stem: sections_and_parts(stem) for stem in STEMS}
    broken = []
    for stem in STEMS:
        nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
        for cell in nb.cells:
            for m in REFERENCE.finditer(cell.source):
                target = by_number.get(m["before"] or m["after"] or stem[:2])
                found = target and int(m["n"]) in have[target][m["kind"].lower()]
                if not found:
                    broken.append(f"{stem} cell {cell.get('id')}: {m[0]!r}")
    assert not broken, "references to no such part or section:\n" + "\n".join(broken)


LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)\s#]+)")  # a markdown link to a file of the kit


@pytest.mark.parametrize("stem", STEMS)
def test_every_link_to_a_file_of_the_kit_resolves(stem):
    """A note a lesson links to (``notes/<topic>.md``) exists, from either edition's folder."""
    broken = []
    for nb, folder in (
        (i18n.read_english(stem), runner.NOTEBOOKS),
        (i18n.translated_notebook("zh_CN", stem), runner.NOTEBOOKS / "zh_CN"),
    ):
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                links = LINK.findall(cell.source)
                broken += [t for t in links if not os.path.exists(os.path.normpath(folder / t))]
    assert not broken, f"{stem}: links to no such file: {broken}"
