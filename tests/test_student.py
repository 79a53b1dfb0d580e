"""The learner's copy (lab/, make lab) and the student copy (make student): solutions become
stubs, checks stay, the checks fail helpfully, and a notebook the learner changed is kept."""

from __future__ import annotations

import os
import re
import subprocess

import nbformat
import pytest

from labtools import i18n, runner, student

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


def test_lab_holds_every_edition_the_start_page_and_the_catalog(tmp_path):
    counts, done = student.write_lab(tmp_path / "lab")
    assert set(done.values()) == {"written"}
    for folder in [tmp_path / "lab", *(tmp_path / "lab" / lang for lang in i18n.editions())]:
        for stem, n in counts.items():
            nb = nbformat.read(folder / f"{stem}.ipynb", as_version=4)
            stubs = [c for c in nb.cells if c.source.startswith(student.TODO)]
            assert len(stubs) == n and not any(
                "solution" in c.metadata.get("tags", []) for c in nb.cells
            )
    for name in ("README.md", "catalog.json"):
        assert (tmp_path / "lab" / name).read_bytes() == (runner.NOTEBOOKS / name).read_bytes()
    assert student.write_lab(tmp_path / "lab")[1] == dict.fromkeys(done, "unchanged")


LINK = re.compile(r"\]\((?!https?:|#|mailto:|/)([^)\s#]+)")  # a link to a file, anchor left off


def test_every_link_in_lab_reaches_its_file(tmp_path):
    """Links between lessons, to the start page, the notes and the repository's files
    (../CONTRIBUTING.md) work from lab/ as from notebooks/: lab/ sits beside notebooks/."""
    out, where = tmp_path / "lab", runner.REPO_ROOT / "lab"  # where make lab writes it
    student.write_lab(out)
    broken = []
    for path in sorted(p for p in out.rglob("*") if p.suffix in (".ipynb", ".md")):
        rel = path.relative_to(out)
        if path.suffix == ".ipynb":
            nb = nbformat.read(path, as_version=4)
            text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        else:
            text = path.read_text()
        for link in LINK.findall(text):
            target = os.path.normpath(where / rel.parent / link)
            inside = os.path.relpath(target, where)
            found = out / inside if not inside.startswith("..") else target
            if not os.path.exists(found):
                broken.append(f"lab/{rel}: {link}")
    assert not broken, "\n".join(broken)


def test_a_file_the_learner_changed_is_kept_and_the_others_refreshed(tmp_path, monkeypatch, capsys):
    out = tmp_path / "lab"
    v1 = {"a.ipynb": b"one", "b.ipynb": b"one", "old.ipynb": b"gone", "mine.ipynb": b"gone"}
    student.write_files(out, v1, keep_changed=True)
    (out / "b.ipynb").write_bytes(b"the learner ran it and saved")
    (out / "mine.ipynb").write_bytes(b"the learner's too")
    done = student.write_files(out, {"a.ipynb": b"two", "b.ipynb": b"two"}, keep_changed=True)
    assert done == {"a.ipynb": "written", "b.ipynb": "kept", "old.ipynb": "removed"}
    assert (out / "a.ipynb").read_bytes() == b"two"  # a git pull reaches the learner
    assert (out / "b.ipynb").read_bytes() == b"the learner ran it and saved"
    assert not (out / "old.ipynb").exists() and (out / "mine.ipynb").exists()
    (out / "b.ipynb").unlink()  # the way to the new version: delete it
    assert student.write_files(out, {"b.ipynb": b"two"}, keep_changed=True)["b.ipynb"] == "written"

    monkeypatch.setattr(student, "LAB", tmp_path / "real")  # the command line says it once
    student.main(["--lab"])
    lesson = tmp_path / "real" / "00_environment.ipynb"
    lesson.write_text(lesson.read_text().replace("TODO", "DONE"))
    capsys.readouterr()
    student.main(["--lab"])
    said = capsys.readouterr().out.splitlines()
    kept = [line for line in said if "00_environment" in line]
    assert kept == [student.kept_line("00_environment.ipynb")] and "make lab-reset" in kept[0]
    student.main(["--lab", "--reset"])
    assert "DONE" not in lesson.read_text()


def test_make_lab_opens_the_learners_copy_and_solutions_1_the_answer_key():
    def dry(*args: str) -> str:
        make = ["make", "-n", "-C", str(runner.REPO_ROOT), "lab", *args]
        return subprocess.run(make, capture_output=True, text=True, timeout=60).stdout

    learner, teacher = dry(), dry("SOLUTIONS=1")
    assert "labtools.student --lab" in learner and "--notebook-dir=lab " in learner
    assert "labtools.student" not in teacher and "--notebook-dir=notebooks " in teacher
    assert "--ContentsManager.post_save_hook=labtools.savehook" in teacher
    assert "/lab/tree/zh_CN" in dry("LANG=zh_CN")
    docker = (runner.REPO_ROOT / "Dockerfile").read_text()
    assert "labtools.student --lab && exec jupyter lab" in docker and "--notebook-dir=lab" in docker
    assert "lab/" in (runner.REPO_ROOT / ".gitignore").read_text().split()


@pytest.mark.notebook  # executes the learner's copy of notebook 00 (the cheapest lesson)
def test_student_notebook_checks_fail_helpfully(tmp_path):
    """Run All of a lesson in lab/ with its exercises open exits 0: each check says "not yet"."""
    student.write_lab(tmp_path / "lab")
    outcome = runner.execute(
        "00_environment",
        tmp_path / "out",
        quick=True,
        source=tmp_path / "lab" / "00_environment.ipynb",
    )
    assert outcome.status == "ok", outcome.error  # no traceback anywhere
    nb = nbformat.read(outcome.output, as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "❌ Exercise 00.1: not yet" in text and "❌ Exercise 00.2: not yet" in text
    assert "Traceback" not in text
