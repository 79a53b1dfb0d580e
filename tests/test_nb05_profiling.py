"""Notebook 05: the profiler left a real trace and table, py-spy a flame graph (or a reasoned skip),
and the flame-graph advice was checked against the installed torch."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from helpers import cell_scripts, launch

STEM = "05_profiling"
REGIONS = ("data", "forward", "backward", "optimizer", "communication")


def test_trace_is_a_chrome_trace_with_the_labelled_regions(notebook_record):
    m = notebook_record(STEM)["metrics"]
    trace = json.loads(Path(m["trace_path"]).read_text())
    assert trace["traceEvents"], "an empty trace"
    names = {event.get("name") for event in trace["traceEvents"]}
    assert set(REGIONS) <= names, f"record_function labels missing: {set(REGIONS) - names}"


def test_top_ops_name_real_operators_including_a_conv_or_matmul(notebook_record):
    top_ops = notebook_record(STEM)["metrics"]["top_ops"]
    assert top_ops and all(op.startswith("aten::") for op in top_ops)
    assert any(re.search(r"conv|addmm|\bmm\b|matmul|gemm", op) for op in top_ops), top_ops


def test_breakdown_covers_every_region_in_both_phases(notebook_record):
    m = notebook_record(STEM)["metrics"]
    for phase in ("as is", "input bound"):
        assert set(m["ms_per_step"][phase]) == set(REGIONS)
        assert all(ms >= 0 for ms in m["ms_per_step"][phase].values())
        assert 0 <= m["data_share"][phase] <= 1
    assert m["ms_per_step"]["as is"]["backward"] > 0 and m["collectives_ms_per_step"] > 0
    if m["world_size"] > 1:  # merged intervals of one kind of transfer: never above 100 %
        assert 0 < m["collectives_overlap_with_backward"] <= 1
    assert m["input_bound_slowdown"] > 0
    assert isinstance(m["rule_of_thumb_holds_here"], bool)


def test_flamegraph_is_an_svg_or_a_skip_with_its_reason(notebook_record):
    record = notebook_record(STEM)
    m = record["metrics"]
    if m["flamegraph_path"]:
        text = Path(m["flamegraph_path"]).read_text()
        assert "<svg" in text[:2000] and "samples" in text
        assert set(m["flame_shares"]) >= {"all_reduce", "DataLoader _next_data"}
        assert sum(m["flame_shares"].values()) > 0
    else:
        skips = {s["what"]: s["why"] for s in record["skipped"]}
        assert "py-spy" in skips.get("py-spy flame graph", ""), record["skipped"]


def test_gpu_sampling_ran_on_gpus_and_was_skipped_with_a_reason_elsewhere(notebook_record):
    record = notebook_record(STEM)
    utilisation = record["metrics"]["gpu_util_by_phase"]
    if record["hardware"]["gpu_count"]:
        assert set(utilisation) == {"as is", "input bound"}
    else:
        assert utilisation is None
        skipped = [s for s in record["skipped"] if "NVML" in s["what"]]
        assert skipped and "GPU" in skipped[0]["why"]


def test_watched_windows_agree_on_every_rank(tmp_path, no_orphans):
    """The GPU-only --watch-seconds path, run on CPU: each loader trains unprofiled for its
    window, every rank switches at the same step, and the job still stops when told."""
    cell_scripts.ensure_script(STEM, "work/profile_core.py", cwd=tmp_path)  # it imports the core
    script = cell_scripts.ensure_script(STEM, "work/profile_ddp.py", cwd=tmp_path)
    stop = tmp_path / "stop"
    stop.touch()  # stop at the first check after the windows
    argv = [
        "--out",
        str(tmp_path),
        "--active",
        "1",
        "--slow-data-ms",
        "1",
        "--watch-seconds",
        "0.5",
        "--stop-file",
        str(stop),
    ]
    result = launch.torchrun(
        script,
        argv,
        nproc=2,
        device="cpu",
        out_dir=tmp_path / "job",
        timeout=300,
        env={"KINETO_LOG_LEVEL": "5"},
    )
    windows = [json.loads((tmp_path / f"watch_rank{r}.json").read_text()) for r in (0, 1)]
    assert list(windows[0]) == ["as is", "input bound"]
    for name in windows[0]:
        assert windows[0][name]["steps"] == windows[1][name]["steps"]  # switched together
        assert windows[0][name]["steps"] % 5 == 0 and windows[0][name]["steps"] > 0
        assert windows[0][name]["started"] < windows[0][name]["ended"]
    assert windows[0]["as is"]["ended"] <= windows[0]["input bound"]["started"]
    assert [result.rank(r)["steps_after_profiling"] for r in (0, 1)] == [5, 5]


def test_profiled_steps_never_synchronise_and_whole_steps_are_timed(notebook_record):
    """Syncs inside a profiled step would remove the CPU/GPU overlap the trace shows; the one
    place they belong is around whole steps timed by the wall clock."""
    functions = {}
    for script in ("work/profile_core.py", "work/profile_ddp.py"):  # the core, the measurements
        text = cell_scripts.cell_script(STEM, script)
        functions |= {
            n.name: ast.get_source_segment(text, n)
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.FunctionDef)
        }
    for name in ("step", "profiled", "profile_phase"):
        assert "synchronize" not in functions[name], f"{name} synchronises inside profiled code"
    assert "synchronize" in functions["wall_ms_per_step"]
    wall = notebook_record(STEM)["metrics"]["wall_ms_per_step"]
    assert set(wall) == {"as is", "input bound"} and all(ms > 0 for ms in wall.values())


def test_the_straggler_exercises_pass_with_their_solutions(notebook_record):
    """07.1 slows rank 1's data and the job sees it; 07.2 finds rank 1 from the traces alone."""
    verdicts = notebook_record(STEM)["metrics"]["exercises"]
    assert verdicts == {"05.1": True, "05.2": True}, verdicts
