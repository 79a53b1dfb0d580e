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
    }


def test_the_table_totals_every_lesson():
    rows = {"a": reading.reading(lesson()), "b": reading.reading(lesson())}
    last = reading.table(rows).splitlines()[-1]
    assert last.startswith("| all | 36 | 11 | 26 | 4 | 6 | 4 | 2 | 2 |")


BUDGET = {"words": 2500, "longest_cell": 150, "setup_lines": 8, "first_script": 60}
IN_PROCESS = {"01_data_parallel"}  # DataParallel: one process, its exercises work in the kernel


def test_every_lesson_keeps_the_learners_budget():
    """Issue 32: prose a learner reads, one call before the lesson, a small first script, and
    2-4 exercises that run or check a distributed job."""
    over = []
    for stem, row in reading.every_lesson().items():
        over += [f"{stem}: {k} {row[k]} > {limit}" for k, limit in BUDGET.items() if row[k] > limit]
        if not 2 <= row["exercises"] <= 4:
            over.append(f"{stem}: {row['exercises']} exercises, not 2-4")
        if stem not in IN_PROCESS and not row["job_exercises"]:
            over.append(f"{stem}: no exercise runs or checks a job")
        if row["guide_cells"]:
            over.append(f"{stem}: {row['guide_cells']} cells argue with 'the guide'")
    assert not over, "\n".join(over)
