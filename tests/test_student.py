"""The student copy: solutions become stubs, checks stay, and the checks fail helpfully."""

from __future__ import annotations

import nbformat
import pytest

from labtools import runner, student

SOLUTION = '''
def bus_bandwidth(nbytes: float, seconds: float, world: int) -> float:
    """GB/s of a ring all-reduce."""
    return nbytes * 2 * (world - 1) / world / seconds / 1e9


answer = sum(range(9))
'''


def test_stub_keeps_names_and_signatures_but_not_the_solution():
    stub = student.stub(SOLUTION)
    assert "def bus_bandwidth(nbytes: float, seconds: float, world: int) -> float:" in stub
    assert '"""GB/s of a ring all-reduce."""' in stub
    assert "raise NotImplementedError" in stub and "answer = ..." in stub
    assert "1e9" not in stub and "range(9)" not in stub
    namespace: dict = {}
    exec(stub, namespace)  # the stub runs: the check cell can then say "not yet"
    assert namespace["answer"] is Ellipsis


def test_student_copy_of_every_lesson(tmp_path):
    counts = student.write_student_copy(tmp_path / "student")
    assert set(counts) == set(runner.notebook_stems())
    for stem, n in counts.items():
        nb = nbformat.read(tmp_path / "student" / f"{stem}.ipynb", as_version=4)
        assert all("solution" not in c.metadata.get("tags", []) for c in nb.cells)
        teacher = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
        solutions = [c for c in teacher.cells if "solution" in c.metadata.get("tags", [])]
        assert n == len(solutions)


@pytest.mark.notebook  # executes the student copy of notebook 00
def test_student_notebook_checks_fail_helpfully(tmp_path):
    student.write_student_copy(tmp_path / "student")
    outcome = runner.execute(
        "00_environment",
        tmp_path / "out",
        quick=True,
        source=tmp_path / "student" / "00_environment.ipynb",
    )
    assert outcome.status == "ok", outcome.error  # no traceback anywhere
    nb = nbformat.read(outcome.output, as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "❌ Exercise 00.1: not yet" in text and "❌ Exercise 00.2: not yet" in text
    assert "Traceback" not in text
