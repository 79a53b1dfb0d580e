"""labtools.reading counts what a learner meets, on a lesson built for the purpose."""

from __future__ import annotations

import nbformat

from labtools import reading

v4 = nbformat.v4


def lesson() -> nbformat.NotebookNode:
    return v4.new_notebook(
        cells=[
            v4.new_markdown_cell("# 99 · Demo\n\nOne two three."),
            v4.new_code_cell("quick = False\n\nout_dir = ''", metadata={"tags": ["parameters"]}),
            v4.new_markdown_cell(
                "## 1. The core\n\nThe guide says otherwise; four five six seven."
            ),
            v4.new_code_cell("%%writefile work/core.py\nimport torch\n\nprint(torch)"),
            v4.new_code_cell("%%writefile -a work/core.py\nprint('more')"),
            v4.new_code_cell("%%writefile work/other.py\nprint('not the first')"),
            v4.new_markdown_cell("## Exercises"),
            v4.new_code_cell("answer = 1", metadata={"tags": ["solution"]}),
            v4.new_code_cell("exercise.equal('99.1', answer, 1, hint='one')"),
            v4.new_markdown_cell("Second."),
            v4.new_code_cell(
                "job = launch.torchrun('work/core.py')", metadata={"tags": ["solution"]}
            ),
            v4.new_code_cell("exercise.equal('99.2', job.ok, True, hint='run it')"),
        ]
    )


def test_a_lesson_is_counted_as_a_learner_meets_it():
    row = reading.reading(lesson())
    assert row == {
        "words": 5 + 11 + 1 + 1,  # "#" and "·" are not words; "## 1." counts "1."
        "longest_cell": 11,
        "code_lines": 2 + 3 + 2 + 2 + 1 + 1 + 1 + 1,  # %%writefile lines count
        "setup_lines": 2,  # the parameters cell, before "## 1."
        "first_script": 3,  # work/core.py's two cells, without their %%writefile lines
        "exercises": 2,
        "job_exercises": 1,
        "guide_cells": 1,
        "rec_lines": 0,
        "kit_imports": 0,
        "plain_scripts": "2/2",  # work/core.py and work/other.py import nothing from helpers
        "exercises_in_place": "2/2",  # no Summary heading: nothing comes after it
        "unsolved": "2/2",
    }


def test_the_table_totals_every_lesson():
    rows = {"a": reading.reading(lesson()), "b": reading.reading(lesson())}
    last = reading.table(rows).splitlines()[-1]
    assert last.startswith("| all | 36 | 11 | 26 | 4 | 6 | 4 | 2 | 2 |")
    assert last.endswith("| 0 | 0 | 4/4 | 4/4 | 4/4 |")  # the "k/n" columns add up by part


def path_lesson() -> nbformat.NotebookNode:
    """A lesson with the record, the kit and exercises on both sides of its Summary."""
    code = v4.new_code_cell
    return v4.new_notebook(
        cells=[
            v4.new_markdown_cell("# 98 · Path"),
            code("quick = False", metadata={"tags": ["parameters"]}),
            code("from helpers import lesson\n\nrec, plan = lesson.start('98', globals())"),
            v4.new_markdown_cell("## 1. The core"),
            code(
                "%%writefile work/core.py\nimport torch\nfrom helpers.launch import (\n"
                "    write_rank_output,\n)"
            ),
            code("%%writefile work/plain.py\nimport torch"),
            code("%%writefile work/child.py\nfrom core import setup"),  # the kit through core.py
            code("%%writefile work/later.py\nfrom ddp_train import Trainer"),  # another lesson's
            code("%%writefile work/job.yaml\nkind: TrainJob"),  # not a Python script
            code("%time x = 1\nrec.add(\n    a=1,\n    b=2,\n)\nshow(rec)\nprint(x)"),
            v4.new_markdown_cell("**Exercise 98.1.** Set `answer`."),
            code("answer = 1\nrec.add(answer=answer)", metadata={"tags": ["solution"]}),
            code("exercise.equal('98.1', answer, 1, hint='one')"),
            v4.new_markdown_cell("## Summary\n\nDone."),
            v4.new_markdown_cell("## Exercises"),
            code("exercise.equal('98.2', rec.metrics, {}, hint='nothing to write')"),
            code("rec.write()"),
        ]
    )


def test_the_learners_path_is_counted():
    row = reading.reading(path_lesson(), {"ddp_train": True})
    assert row["rec_lines"] == 4 + 1 + 1  # rec.add(...) over 4 lines, show(rec), rec.write()
    assert row["kit_imports"] == 3  # one import statement over 3 lines, in work/core.py
    assert row["plain_scripts"] == "1/4"  # only work/plain.py runs outside the kit
    assert row["exercises_in_place"] == "1/2"  # 98.1 before the Summary, 98.2 after it
    assert row["unsolved"] == "1/2"  # 98.2 has no solution cell: nothing to stub
    assert reading.reading(path_lesson())["plain_scripts"] == "2/4"  # ddp_train unknown


def test_every_lesson_resolves_scripts_of_earlier_lessons():
    """Notebook 03's scripts import notebook 02's ddp_train.py, which imports the kit."""
    rows = reading.every_lesson()
    assert reading.script_kit(
        nbformat.read(reading.NOTEBOOKS / "02_distributed_data_parallel.ipynb", as_version=4), {}
    )["ddp_train"]
    for stem, row in rows.items():
        plain, written = map(int, row["plain_scripts"].split("/"))
        assert plain <= written and row["kit_imports"] >= 0, stem
        assert row["unsolved"].split("/")[1] == row["exercises_in_place"].split("/")[1], stem


BUDGET = {"words": 2500, "longest_cell": 150, "setup_lines": 8, "first_script": 60}
IN_PROCESS = {"01_data_parallel"}  # DataParallel: one process, its exercises work in the kernel


def test_every_lesson_keeps_the_learners_budget():
    """Issue 32: prose a learner reads, one call before the lesson, a small first script, and
    2-4 exercises that run or check a distributed job; issue 44: each one open in lab/."""
    over = []
    for stem, row in reading.every_lesson().items():
        over += [f"{stem}: {k} {row[k]} > {limit}" for k, limit in BUDGET.items() if row[k] > limit]
        if not 2 <= row["exercises"] <= 4:
            over.append(f"{stem}: {row['exercises']} exercises, not 2-4")
        if stem not in IN_PROCESS and not row["job_exercises"]:
            over.append(f"{stem}: no exercise runs or checks a job")
        if row["guide_cells"]:
            over.append(f"{stem}: {row['guide_cells']} cells argue with 'the guide'")
        unsolved, exercises = row["unsolved"].split("/")
        if unsolved != exercises:  # issue 44: make lab hands out every exercise open
            over.append(f"{stem}: {row['unsolved']} exercises stubbed in the learner's copy")
    assert not over, "\n".join(over)
