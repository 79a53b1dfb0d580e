"""make gpu-check's first runs: what never ran on a GPU, and how each verdict is read."""

from __future__ import annotations

import time
from pathlib import Path

from helpers import cell_scripts
from labtools import gpu_first_runs, gpucheck
from labtools.gpu_first_runs import FIRST_RUNS


def test_each_first_run_starts_a_script_its_lesson_writes():
    for first in FIRST_RUNS:
        written = {Path(w).name for w, _, _ in cell_scripts.writefile_cells(first.lesson)}
        assert first.script in written, first


def no_scripts(monkeypatch, tmp_path):  # the verdicts need no script written: seconds saved
    lessons = {f.lesson: tmp_path for f in FIRST_RUNS}
    monkeypatch.setattr(gpu_first_runs.exported_scripts, "lesson_folders", lambda root: lessons)


def test_one_gpu_runs_what_one_gpu_can_and_says_why_not_for_the_rest(tmp_path, monkeypatch):
    no_scripts(monkeypatch, tmp_path)
    started = []
    monkeypatch.setattr(
        gpu_first_runs, "_run", lambda first, *a: started.append(first.script) or "held: ok"
    )
    verdicts = gpu_first_runs.run_all(tmp_path, gpus=1, deadline=time.monotonic() + 600)
    assert set(verdicts) == {f.what for f in FIRST_RUNS}
    for first in FIRST_RUNS:
        if first.least_gpus > 1:
            assert (
                verdicts[first.what]
                == f"not run: needs {first.least_gpus} GPUs, this machine has 1"
            )
            assert first.script not in started
        else:
            assert verdicts[first.what] == "held: ok"


def test_a_spent_budget_starts_nothing(tmp_path, monkeypatch):
    no_scripts(monkeypatch, tmp_path)
    monkeypatch.setattr(gpu_first_runs, "_run", lambda *a: 1 / 0)
    verdicts = gpu_first_runs.run_all(tmp_path, gpus=8, deadline=time.monotonic())
    assert set(verdicts.values()) == {"not run: the gpu-check budget was spent"}


def test_tensor_parallel_verdict_reads_the_jobs_own_numbers():
    good = {"max_diff_logits": 3e-7, "max_diff_after_step": 1e-8, "per_block": {"all_reduce": 2}}
    out = {"mesh": [[0, 1, 2, 3], [4, 5, 6, 7]], "tp": good, "tp_sp": good}
    assert gpu_first_runs._tp_gpt({0: out}, 8).startswith("held: ")
    drifted = {**good, "max_diff_after_step": 2e-3}
    assert gpu_first_runs._tp_gpt({0: {**out, "tp_sp": drifted}}, 8).startswith("did not hold: ")


def test_one_process_per_gpu_is_read_from_nvidia_smis_compute_apps():
    fine = {101: {"0"}, 102: {"1"}}
    assert gpu_first_runs._one_process_per_gpu({}, 2, fine).startswith("held: 2 workers on 2 GPU")
    on_gpu_0 = {101: {"0"}, 102: {"0", "1"}}  # rank 1 opened a context on cuda:0 too
    assert gpu_first_runs._one_process_per_gpu({}, 2, on_gpu_0).startswith("did not hold: ")
    assert gpu_first_runs._one_process_per_gpu({}, 2, {}).startswith("did not hold: nvidia-smi")


def test_results_show_the_first_runs(tmp_path):
    (tmp_path / "summary.json").write_text(
        '{"hardware": {"gpu_names": ["NVIDIA H200"]}, "notebooks": [],'
        ' "first_runs": {"09 §3: TP": "not run: needs 2 GPUs, this machine has 1"}}'
    )
    text = gpucheck.results_markdown(gpucheck.figures(tmp_path))
    assert "| 09 §3: TP | not run: needs 2 GPUs, this machine has 1 |" in text
