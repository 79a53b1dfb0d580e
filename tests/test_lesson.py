"""One call opens a lesson: the parameters cell is read, checked, quick mode applied, the record
opened; metrics are kept where they are computed and the last line writes them."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from helpers import exercise, lesson, params
from helpers.params import ParameterError

CELL = """out_dir = ""  # where metrics.json goes
quick = False  # True: the smallest run (CI)
epochs = 2  # training epochs (quick: 1)
fail_at_step = 30  # rank 1 dies here, at least 2
lr = 0.05  # SGD learning rate
train_samples = 0  # images; 0: all of them (quick: 800)
model_kind = "cnn"  # "cnn" or "mlp"
mesh_2d = True  # run the 2-D mesh part
"""


def kernel(tmp_path, injected: str = "") -> dict:
    """A notebook's globals after it ran CELL and, under papermill, the injected cell."""
    ns: dict = {"In": ["", CELL]}
    exec(CELL, ns)  # noqa: S102 - as the kernel runs the parameters cell
    ns["out_dir"] = str(tmp_path / "run")
    if injected:
        ns["In"].append(f"# Parameters\n{injected}")
        exec(injected, ns)  # noqa: S102
    return ns


def test_the_parameters_cell_declares_kind_and_quick_value():
    found = {p.name: p for p in params.declared(CELL)}
    assert [p.name for p in params.declared(CELL)][:3] == ["out_dir", "quick", "epochs"]
    assert found["epochs"].quick == 1 and found["train_samples"].quick == 800
    assert found["lr"].quick is None
    assert found["fail_at_step"].kind.words == "a whole number >= 2"
    assert found["train_samples"].kind.accepts(0) and not found["epochs"].kind.accepts(0)
    assert found["model_kind"].kind.accepts("mlp") and not found["model_kind"].kind.accepts("x")
    assert found["mesh_2d"].kind is params.FLAG and not found["lr"].kind.accepts(0.0)


def test_start_checks_applies_quick_and_opens_the_record(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ns = kernel(tmp_path, "quick = True\nlr = 0.1\n")
    rec, plan = lesson.start("99_test", ns, min_ranks=2)
    out = capsys.readouterr().out
    assert "Quick mode uses epochs=1 (2), train_samples=800 (0)" in out
    assert f"Found: {plan['device']} -> " in out and plan["nproc"] >= 2
    assert ns["out_dir"] == tmp_path / "run" and (tmp_path / "run" / "work").is_dir()
    assert rec.params == {
        "quick": True,
        "epochs": 1,
        "fail_at_step": 30,
        "lr": 0.1,
        "train_samples": 800,
        "model_kind": "cnn",
        "mesh_2d": True,
    }
    assert rec.hardware["lesson_plan"] == plan


def test_a_bad_value_stops_start_before_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ParameterError, match="parameter fail_at_step must be a whole number >= 2"):
        lesson.start("99_test", kernel(tmp_path, "fail_at_step = 1\n"))
    assert not (tmp_path / "run").exists()


def test_start_without_the_parameters_cell_says_to_run_it(tmp_path):
    with pytest.raises(ParameterError, match="run the parameters cell first"):
        lesson.start("99_test", {"In": ["", "import torch"]})


def test_without_history_the_lessons_own_parameters_cell_is_read(tmp_path, monkeypatch):
    """nbval runs cells with store_history=False: ``In`` stays empty."""
    monkeypatch.chdir(tmp_path)
    ns = {"out_dir": str(tmp_path / "run"), "quick": True, "world_size": 0, "In": [""]}
    rec, _ = lesson.start("00_environment", ns, min_ranks=0)
    assert rec.params == {"quick": True, "world_size": 0}


def test_a_lesson_without_workers_has_no_plan(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rec, plan = lesson.start("99_test", kernel(tmp_path), min_ranks=0)
    assert plan is None and "lesson_plan" not in rec.hardware


def test_metrics_kept_where_computed_are_written_with_the_exercises(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(exercise, "results", {"99.1": True})
    rec, _ = lesson.start("99_test", kernel(tmp_path), min_ranks=0)
    rec.add(accuracy=0.9)
    rec.add(speedup=1.5)
    rec.write()
    written = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert written["metrics"] == {"accuracy": 0.9, "speedup": 1.5, "exercises": {"99.1": True}}


def test_a_job_exercise_is_checked_from_what_the_ranks_wrote(capsys):
    ran = SimpleNamespace(outputs={0: {"same_order": True}, 1: {"same_order": True}}, returncode=0)
    exercise.job("99.1", ran, "drop set_epoch", same_order=True)
    assert exercise.results["99.1"]
    exercise.job("99.2", ran, "h", returncode=0, same_order=lambda v: v is True)
    assert exercise.results["99.2"]
    ran.outputs[1]["same_order"] = False
    exercise.job("99.3", ran, "drop set_epoch", same_order=True)
    assert not exercise.results["99.3"]
    assert "In rank 1, same_order was False. Hint: drop set_epoch" in capsys.readouterr().out
    exercise.job("99.4", ran, "h", shuffled=True)
    assert not exercise.results["99.4"]
    assert "No rank wrote shuffled; the ranks wrote ['same_order']" in capsys.readouterr().out
    exercise.job("99.7", ran, "h", same_order=...)  # the learner's answer, still the stub
    assert "Replace the `...` with your answer." in capsys.readouterr().out
    exercise.job("99.5", ..., "h", same_order=True)
    assert not exercise.results["99.5"]
    assert "Run the job" in capsys.readouterr().out
    failed = SimpleNamespace(result=SimpleNamespace(outputs={}, returncode=1, log="boom"))
    exercise.job("99.6", failed, "h", returncode=1, log=lambda text: "boom" in text)
    assert exercise.results["99.6"]


def test_a_rerun_of_a_writefile_cell_keeps_an_edit_made_elsewhere(tmp_path, monkeypatch, capsys):
    from helpers.cell_scripts import EditKeeper

    monkeypatch.chdir(tmp_path)
    keeper = EditKeeper()
    cell = "%%writefile work/x.py\nprint('cell')\n"
    ran = SimpleNamespace(raw_cell=cell)
    script = tmp_path / "work" / "x.py"
    script.parent.mkdir()
    keeper.before(ran)  # the first run: nothing there yet
    script.write_text("print('cell')\n")  # what %%writefile does
    keeper.after(SimpleNamespace(info=ran))
    keeper.before(ran)  # a plain rerun: nothing was edited, nothing kept
    assert not list(script.parent.glob("x.py.edited-*"))
    script.write_text("print('my edit')\n")  # the learner, in JupyterLab's editor
    keeper.before(ran)
    assert (script.parent / "x.py.edited-1").read_text() == "print('my edit')\n"
    assert "x.py was edited outside its cell" in capsys.readouterr().out
    keeper.before(SimpleNamespace(raw_cell="print(1)"))  # other cells are not watched


WORLD_CELL = """out_dir = ""  # where metrics.json goes
quick = False  # True: the smallest run (CI)
world_size = 0  # caps the ranks; 0: no cap
"""


@pytest.mark.parametrize(
    ("gpus", "asked", "said"),
    [
        (0, 3, "world_size: using 2 instead of 3, because without 3 GPUs the lesson runs 2 "),
        (0, 5, "world_size: using 2 instead of 5, because without 5 GPUs the lesson runs 2 "),
        (4, 6, "world_size: using 4 instead of 6, because only 4 GPU(s) are visible and one "),
        (0, 1, "world_size: using 2 instead of 1, because this lesson needs at least 2 ranks."),
    ],
)
def test_a_world_size_the_plan_cannot_give_is_said_in_one_line(
    tmp_path, monkeypatch, capsys, gpus, asked, said
):
    """Issue 47, case 3: `-p world_size 3` on a 2-process CPU plan ran 2 ranks, silently."""
    from helpers import env

    found = env.GPUInfo("test", gpus=[env.GPU(i, f"GPU {i}", 80 * 2**30, 0) for i in range(gpus)])
    monkeypatch.setattr(env, "gpu_info", lambda: found)
    monkeypatch.chdir(tmp_path)
    ns: dict = {"In": ["", WORLD_CELL, f"# Parameters\nworld_size = {asked}\n"]}
    exec(WORLD_CELL, ns)  # noqa: S102 - as the kernel runs the parameters cell
    ns.update(out_dir=str(tmp_path / "run"), world_size=asked)
    rec, plan = lesson.start("99_test", ns, min_ranks=2)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("world_size")]
    assert len(lines) == 1 and lines[0].startswith(said), lines
    assert rec.params["world_size"] == asked and plan["nproc"] == int(said.split()[2])
