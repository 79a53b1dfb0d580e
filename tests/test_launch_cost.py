"""benchmarks/launch_cost.py's floor: what a run's torchrun jobs cost at the least."""

from __future__ import annotations

import json

from helpers.launch import JOB_RECORD


def test_the_floor_is_a_kernel_and_an_empty_launch_per_job_at_most_its_time(
    tmp_path, capsys, launch_cost
):
    folder = tmp_path / "02_distributed_data_parallel"
    folder.mkdir()
    entry = {"notebook": folder.name, "status": "ok", "seconds": 40.0}
    (tmp_path / "summary.json").write_text(json.dumps({"notebooks": [entry]}))
    for name, job in {
        "ddp": {"started": 0.0, "seconds": 20.0, "nproc": 2},
        "crash": {"started": 30.0, "seconds": 3.0, "nproc": 2},  # failed before meeting
    }.items():  # each job's record in its own folder, as helpers.launch leaves them
        (folder / "work" / name).mkdir(parents=True)
        (folder / "work" / name / JOB_RECORD).write_text(json.dumps(job))
    launch_cost.print_floor(tmp_path, kernel=5.0, empty={1: 6.0, 2: 7.0})
    row = next(ln for ln in capsys.readouterr().out.splitlines() if folder.name in ln)
    assert row.split()[1:] == ["40.0", "2", "23.0", "15.0"]  # 5 + 7 + min(3, 7)
