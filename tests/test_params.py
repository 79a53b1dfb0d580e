"""Bad notebook parameters stop the notebook with one clear sentence, before any work starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import params
from helpers.params import ParameterError
from helpers.paths import REPO_ROOT


def namespace(tmp_path: Path, injected: str = "", **values) -> dict:
    """A notebook's globals after papermill ran the parameters cell and its injected cell."""
    ns = {"out_dir": str(tmp_path / "out"), "quick": True, "epochs": 2, "lr": 0.05, "In": [""]}
    ns.update(values)
    if injected:
        ns["In"].append(f"# Parameters\n{injected}\n")
    return ns


KINDS = {"epochs": params.POSITIVE_INT, "lr": params.POSITIVE}


def test_good_parameters_pass_and_out_dir_is_created(tmp_path):
    params.validate(namespace(tmp_path, 'quick = True\nout_dir = "x"\nepochs = 3\n'), **KINDS)
    assert (tmp_path / "out").is_dir()


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("quick", "yes", "parameter quick must be True or False, got 'yes' (str)"),
        ("epochs", 0, "parameter epochs must be a whole number >= 1, got 0"),
        ("epochs", 2.5, "parameter epochs must be a whole number >= 1, got 2.5 (float)"),
        ("lr", -1, "parameter lr must be a number > 0"),
        ("quick", 1, "must be True or False, got 1 (int)"),
    ],
)
def test_a_wrong_value_names_the_parameter_and_how_to_pass_it(tmp_path, name, value, words):
    with pytest.raises(ParameterError) as err:
        params.validate(namespace(tmp_path, **{name: value}), **KINDS)
    assert words in str(err.value)
    assert f"-p {name} " in str(err.value)


def test_an_unknown_name_lists_what_the_notebook_accepts(tmp_path):
    ns = namespace(tmp_path, "quick = True\nepoch = 3\n", epoch=3)
    with pytest.raises(
        ParameterError,
        match=r"unknown parameter\(s\) epoch: this notebook "
        r"accepts epochs, lr, out_dir, quick",
    ):
        params.validate(ns, **KINDS)


def test_names_are_read_only_from_papermills_injected_cell():
    history = ["x = 1", '# Parameters\nquick = True\nout_dir = "a"\n', "y = 2"]
    assert params.injected_names(history) == ["quick", "out_dir"]


def test_nproc_zero_and_too_many_are_refused(tmp_path):
    kinds = {**KINDS, "nproc": params.NPROC}
    with pytest.raises(ParameterError, match="nproc must be None .* or a whole number >= 1"):
        params.validate(namespace(tmp_path, nproc=0), **kinds)
    with pytest.raises(ParameterError, match="parameter nproc: Asked for 64"):
        params.validate(namespace(tmp_path, nproc=64), **kinds)
    params.validate(namespace(tmp_path, nproc=None), **kinds)


def test_an_out_dir_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")  # not writable as a folder, even for root
    with pytest.raises(ParameterError, match=r"out_dir .* cannot be written .* -p out_dir"):
        params.validate(namespace(tmp_path, out_dir=str(tmp_path / "file" / "out")), **KINDS)


def test_each_run_gets_its_own_folder_and_works_in_it(tmp_path, monkeypatch):
    monkeypatch.setattr(params, "REPO_ROOT", tmp_path)
    monkeypatch.chdir(tmp_path)
    first = params.use_run_folder("02_x", "")
    assert first.parent == tmp_path / "runs" / "manual" / "02_x"
    assert Path.cwd() == first and (first / "work").is_dir()
    given = params.use_run_folder("02_x", tmp_path / "mine")
    assert given == (tmp_path / "mine").resolve() == Path.cwd()


def test_quick_mode_says_what_it_changed_and_keeps_what_was_asked(tmp_path, capsys):
    ns = namespace(tmp_path, "quick = True\nlr = 0.1\n", lr=0.1)
    params.apply_quick(ns, epochs=1, lr=0.01)
    assert (ns["epochs"], ns["lr"]) == (1, 0.1)
    out = capsys.readouterr().out
    assert "Quick mode uses epochs=1 (2) (the full run's value in brackets)." in out
    assert "Quick mode keeps what this run asked for: lr=0.1." in out
    full = namespace(tmp_path, quick=False)
    params.apply_quick(full, epochs=1)
    assert full["epochs"] == 2 and capsys.readouterr().out == ""
    with pytest.raises(ParameterError, match="apply_quick got steps, which the parameters"):
        params.apply_quick(namespace(tmp_path), steps=3)


def test_an_adjusted_value_is_said_with_its_reason(tmp_path, capsys):
    assert params.adjusted("fail_at_step", 30, 14, why="the run has {n} steps", n=15) == 14
    assert capsys.readouterr().out == (
        "fail_at_step: using 14 instead of 30, because the run has 15 steps.\n"
    )
    assert params.adjusted("fail_at_step", 5, 5, why="unused") == 5
    assert capsys.readouterr().out == ""
    with pytest.raises(ParameterError, match="a whole number >= 3, got 2"):
        params.validate(
            {"steps": 2, "out_dir": "x", "quick": True, "In": []}, steps=params.at_least(3)
        )


HOLD_THE_FOLDER = """\
import sys

from helpers import params

params.use_run_folder("02_x", sys.argv[1])
print("holding", flush=True)
sys.stdin.read()  # a kernel in the middle of its run
"""


def test_a_second_run_into_an_out_dir_in_use_is_refused(tmp_path, monkeypatch, no_orphans):
    """Issue 47, case 4: two runs of a lesson into one out_dir overwrote each other's files."""
    monkeypatch.chdir(tmp_path)
    out = (tmp_path / "shared").resolve()
    first = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_FOLDER, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout.readline().startswith("This run's folder")
        assert first.stdout.readline() == "holding\n"
        with pytest.raises(ParameterError) as info:
            params.use_run_folder("02_x", out)
        assert str(info.value) == (
            f"out_dir {out} is in use by another run (pid {first.pid}); pass a folder of its "
            f"own, e.g. -p out_dir {out}-2, or wait until that run has ended."
        )
        assert not list(out.glob("work/*")) and Path.cwd() == tmp_path  # nothing written
    finally:
        first.stdin.close()  # the run ends: the kernel drops its lock with the process
        first.wait(timeout=60)
    assert params.use_run_folder("02_x", out) == out  # the folder is free again
    assert params.use_run_folder("02_x", out) == out  # and a rerun in one kernel keeps it


def twelves_parameters() -> str:
    """Notebook 12's parameters cell, as committed: `sweep_mib = 64  # ..., in MiB (quick: 4)`."""
    done = subprocess.run(
        ["git", "show", "HEAD:notebooks/12_arithmetic_of_parallelism.ipynb"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    cells = json.loads(done.stdout)["cells"]
    [cell] = [c for c in cells if "parameters" in c["metadata"].get("tags", [])]
    return "".join(cell["source"])


def test_a_size_beyond_the_machines_memory_is_refused_before_anything_starts(tmp_path, monkeypatch):
    """Issue 47, case 2: `-p sweep_mib` far beyond the memory ran until the OOM killer came."""
    from helpers import lesson

    monkeypatch.setattr(params, "available_memory", lambda: 8 * 2**30, raising=False)  # free now
    monkeypatch.chdir(tmp_path)
    cell = twelves_parameters()
    ns: dict = {"In": ["", cell, "# Parameters\nsweep_mib = 1048576\n"]}
    exec(cell, ns)  # noqa: S102 - as the kernel runs the parameters cell
    ns.update(out_dir=str(tmp_path / "run"), sweep_mib=1048576)
    with pytest.raises(ParameterError) as info:
        lesson.start("12_arithmetic_of_parallelism", ns, min_ranks=2)
    assert str(info.value) == (
        "parameter sweep_mib must be a whole number >= 1 and at most 8192 (MiB: the memory "
        "this machine has available now), got 1048576 (int). With papermill: -p sweep_mib 64; "
        "in the notebook: sweep_mib = 64"
    )
    assert not (tmp_path / "run").exists()  # refused before anything started
    ns.update(sweep_mib=8192, In=["", cell, "# Parameters\nsweep_mib = 8192\n"])
    lesson.start("12_arithmetic_of_parallelism", ns, min_ranks=2)  # as much as is free: taken


@pytest.mark.parametrize(
    ("comment", "value", "words"),
    [
        ("largest buffer, in MiB, at most 1/16 of memory", 600, "at most 512 (MiB: 1/16 of"),
        ("rows per step (~1 MiB each)", 9000, "at most 8192 (at ~1 MiB each: the memory"),
        ("tokens per rank (~64 KiB each), at most 1/2 of memory", 70000, "at most 65536 (at"),
        ("rows per step (~1 MiB each), at most 2000", 2001, "at most 2000, got 2001"),
        ("one sequence (~64 bytes per token squared)", 12000, "at most 11585 (at ~64 bytes per"),
        ("steps of the run, at most 500", 501, "a whole number >= 1 and at most 500, got 501"),
        ("scratch file, in GiB, at most 1/4 of disk", 3, "at most 2 (GiB: 1/4 of the disk"),
        ("loader workers, at most the cores", 99, "at most 4 (the cores this machine has)"),
    ],
)
def test_a_parameter_declares_its_upper_bound_in_its_comment(
    tmp_path, monkeypatch, comment, value, words
):
    """`at most N`, a memory unit (in MiB), a cost per unit (~N KiB each) or per unit squared
    (attention's scores), a share of the memory, the disk or the cores: the bound is the
    machine's, read when the run starts."""
    monkeypatch.setattr(params, "available_memory", lambda: 8 * 2**30)
    monkeypatch.setattr(params, "free_disk", lambda: 8 * 2**30)
    monkeypatch.setattr(params, "cores", lambda: 4)
    [found] = params.declared(f"size = 2  # {comment}")
    assert not found.kind.accepts(value) and found.kind.accepts(2)
    with pytest.raises(ParameterError) as info:
        params.validate(namespace(tmp_path, size=value), size=found.kind)
    assert words in str(info.value) and "-p size 2;" in str(info.value)


def test_a_folder_on_a_file_system_without_locks_is_still_a_run_folder(tmp_path, monkeypatch):
    """Some network mounts refuse locks (ENOLCK): that is no other run, so the run goes on."""
    import errno
    import fcntl

    def no_locks(*_args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    monkeypatch.chdir(tmp_path)
    assert params.use_run_folder("02_x", tmp_path / "nfs") == tmp_path / "nfs"
