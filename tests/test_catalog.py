"""notebooks/catalog.json's measured times come from a run folder, and only from a clean one."""

from __future__ import annotations

import json

import pytest
from test_report import CPU, GPU, make_run

from labtools import catalog


def test_a_clean_quick_cpu_run_writes_each_lessons_seconds(tmp_path):
    run = make_run(tmp_path / "run", {"00_environment": {"a": 1}, "01_data_parallel": {"a": 1}})
    seconds, on = catalog.measured_on_cpu(run)
    assert seconds == {"00_environment": 12.5, "01_data_parallel": 12.5}
    assert "CPU cores, no GPU (make run QUICK=1," in on and "0 min 25 s in all" in on
    path = tmp_path / "catalog.json"
    path.write_text(catalog.CATALOG.read_text())
    catalog.record_times("measured", seconds, on, path)
    entries = {e["stem"]: e for e in json.loads(path.read_text())["notebooks"]}
    assert entries["01_data_parallel"]["measured"] == {"quick_s": 12.5, "full_s": None, "on": on}
    untouched = {e["stem"]: e for e in catalog.catalog()}["02_distributed_data_parallel"]
    assert entries["02_distributed_data_parallel"]["measured"] == untouched["measured"]


@pytest.mark.parametrize(
    ("metrics", "hardware", "reason"),
    [
        ({"00_environment": None}, CPU, "00_environment did not pass"),
        ({"00_environment": {"a": 1}}, GPU, "ran on cuda"),
    ],
)
def test_a_failed_or_gpu_run_is_refused(tmp_path, metrics, hardware, reason):
    run = make_run(tmp_path / "run", metrics, hardware)
    with pytest.raises(ValueError, match=reason):
        catalog.measured_on_cpu(run)
