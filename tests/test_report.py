"""labtools.compare, labtools.report_pages and their command line (labtools.report) on
synthetic runs: the verdicts a nightly job acts on, and the pages it keeps."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labtools.compare import (
    BOUND,
    DEFAULT_RULES,
    HIGHER,
    LOWER,
    MISSING,
    REGRESSED,
    compare,
    effective_rule,
)
from labtools.report import main
from labtools.report_pages import summarize

ROOT = Path(__file__).resolve().parents[1]

CPU = {
    "device": "cpu",
    "backend": "gloo",
    "nproc": 2,
    "gpu_count": 0,
    "gpu_names": [],
    "driver": None,
    "cpu_count": 2,
    "torch": "2.14.1",
    "cuda_build": None,
    "python": "3.11.7",
    "platform": "Linux",
}
GPU = {
    **CPU,
    "device": "cuda",
    "backend": "nccl",
    "nproc": 8,
    "gpu_count": 8,
    "gpu_names": ["H100"] * 8,
    "driver": "550.54",
    "cuda_build": "12.8",
}

DDP = "02_distributed_data_parallel"
METRICS = {
    "00_environment": {"gpu_count": 0, "allreduce_ok": True},
    DDP: {
        "samples_per_s": {"1": 1000.0, "2": 1800.0},
        "speedup": 1.8,
        "accuracy": {"fp32": 0.95, "bf16": 0.94},
        "max_param_diff": 1e-7,
        "peak_memory_bytes": 1_000_000,
        "resumed_after_failure": True,
        "backend": "gloo",
    },
}


def write_record(
    folder: Path,
    notebook: str,
    metrics: dict[str, Any],
    hardware: dict[str, Any] = CPU,
    skipped: list | None = None,
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "notebook": notebook,
        "hardware": hardware,
        "params": {"out_dir": str(folder), "quick": True},
        "metrics": metrics,
        "skipped": skipped or [],
        "seconds": 10.0,
    }
    (folder / "metrics.json").write_text(json.dumps(record))


def make_run(
    path: Path,
    metrics: dict[str, dict[str, Any] | None] | None = None,
    hardware: dict[str, Any] = CPU,
    summary: bool = True,
    errors: dict[str, str] | None = None,
) -> Path:
    """A run folder as make run leaves it; a notebook whose metrics are None failed."""
    metrics = copy.deepcopy(METRICS if metrics is None else metrics)
    entries = []
    for name, values in metrics.items():
        if values is None:
            (path / name).mkdir(parents=True, exist_ok=True)
            error = (errors or {}).get(name, "RuntimeError: boom")
            entries.append({"notebook": name, "status": "failed", "seconds": 3.0, "error": error})
        else:
            write_record(path / name, name, values, hardware)
            entries.append({"notebook": name, "status": "ok", "seconds": 12.5, "error": None})
    if summary:
        (path / "summary.json").write_text(
            json.dumps(
                {
                    "started": "2025-01-01T00:00:00",
                    "quick": True,
                    "params": {},
                    "notebooks": entries,
                }
            )
        )
    return path


def with_ddp(**changes: Any) -> dict[str, dict[str, Any]]:
    metrics = copy.deepcopy(METRICS)
    metrics[DDP].update(changes)
    return metrics


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return make_run(tmp_path / "base")


def compare_cli(capsys, *argv: Any) -> tuple[int, str, str]:
    code = main(["compare", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def row(comparison, metric: str):
    return next(r for r in comparison.rows if r.metric == metric)


# ---------------------------------------------------------------- direction rules


@pytest.mark.parametrize(
    "name, direction",
    [
        ("samples_per_s.2", HIGHER),
        ("ddp.speedup", HIGHER),
        ("scaling_efficiency.4", HIGHER),
        ("accuracy.bf16", HIGHER),
        ("peak_memory_bytes", LOWER),
        ("memory.peak", LOWER),
        ("seconds", LOWER),
        ("epoch_seconds", LOWER),
        ("max_param_diff", BOUND),
        ("ddp.max_abs_diff", BOUND),
        ("loss", None),
        ("backend", None),
    ],
)
def test_default_directions_come_from_names(name: str, direction: str | None) -> None:
    assert effective_rule(name, DEFAULT_RULES).direction == direction


# ---------------------------------------------------------------- compare


def test_identical_runs_pass(capsys, base: Path, tmp_path: Path) -> None:
    code, out, _ = compare_cli(capsys, base, make_run(tmp_path / "new"))
    assert code == 0
    assert "No changes beyond tolerance" in out and "**OK**" in out


def test_throughput_drop_of_30_percent_regresses(capsys, base: Path, tmp_path: Path) -> None:
    new = make_run(tmp_path / "new", with_ddp(samples_per_s={"1": 1000.0, "2": 1260.0}))
    code, out, _ = compare_cli(capsys, base, new)
    assert code == 1
    line = next(x for x in out.splitlines() if "samples_per_s.2" in x)
    assert "REGRESSED" in line and "-30.0%" in line and "drop > 25%" in line
    comparison = compare(base, new)
    assert comparison.regressed and row(comparison, "samples_per_s.1").verdict == "ok"


def test_throughput_gain_is_an_improvement(base: Path, tmp_path: Path) -> None:
    comparison = compare(base, make_run(tmp_path / "new", with_ddp(speedup=2.5)))
    assert row(comparison, "speedup").verdict == "improved" and not comparison.regressed


@pytest.mark.parametrize("bf16, verdict", [(0.90, REGRESSED), (0.93, "ok")])
def test_accuracy_uses_an_absolute_tolerance(
    base: Path, tmp_path: Path, bf16: float, verdict: str
) -> None:
    new = make_run(tmp_path / "new", with_ddp(accuracy={"fp32": 0.95, "bf16": bf16}))
    assert row(compare(base, new), "accuracy.bf16").verdict == verdict


def test_accuracy_drop_exits_1(capsys, base: Path, tmp_path: Path) -> None:
    new = make_run(tmp_path / "new", with_ddp(accuracy={"fp32": 0.90, "bf16": 0.94}))
    code, out, _ = compare_cli(capsys, base, new)
    assert code == 1 and "accuracy.fp32" in out


def test_memory_rise_regresses_and_time_has_more_slack(base: Path, tmp_path: Path) -> None:
    new = make_run(tmp_path / "new", with_ddp(peak_memory_bytes=1_200_000, step_seconds=1.3))
    base_metrics = with_ddp(step_seconds=1.0)
    comparison = compare(make_run(tmp_path / "base2", base_metrics), new)
    assert row(comparison, "peak_memory_bytes").verdict == REGRESSED
    assert row(comparison, "step_seconds").verdict == "ok"


def test_max_param_diff_over_its_bound_fails_whatever_the_base(base: Path, tmp_path: Path) -> None:
    new = make_run(tmp_path / "new", with_ddp(max_param_diff=1e-3))
    assert row(compare(base, new), "max_param_diff").verdict == REGRESSED
    bad_base = make_run(tmp_path / "bad_base", with_ddp(max_param_diff=1e-3))
    assert compare(bad_base, new).regressed


def test_true_becoming_false_regresses(capsys, base: Path, tmp_path: Path) -> None:
    code, out, _ = compare_cli(
        capsys, base, make_run(tmp_path / "new", with_ddp(resumed_after_failure=False))
    )
    assert code == 1 and "resumed_after_failure" in out


def test_metric_gone_is_flagged_and_new_metric_is_not(base: Path, tmp_path: Path) -> None:
    metrics = with_ddp(loss=0.1)
    del metrics[DDP]["speedup"]
    comparison = compare(base, make_run(tmp_path / "new", metrics))
    assert row(comparison, "speedup").verdict == MISSING and comparison.regressed
    assert row(comparison, "loss").verdict == "new"


def test_info_metrics_never_fail(base: Path, tmp_path: Path) -> None:
    comparison = compare(base, make_run(tmp_path / "new", with_ddp(backend="mpi")))
    assert row(comparison, "backend").verdict == "info" and not comparison.regressed
    assert "mpi" in comparison.to_markdown()


def test_cpu_run_vs_gpu_run_is_refused_unless_forced(capsys, base: Path, tmp_path: Path) -> None:
    new = make_run(tmp_path / "new", hardware=GPU)
    code, _, err = compare_cli(capsys, base, new)
    assert code == 2
    assert "base ran on cpu with 0 GPUs, new on cuda with 8× H100" in err and "--force" in err
    code, out, _ = compare_cli(capsys, base, new, "--force")
    assert code == 0 and "compared anyway" in out


def test_corrupt_metrics_json_names_the_file(capsys, base: Path, tmp_path: Path) -> None:
    new = make_run(tmp_path / "new")
    bad = new / DDP / "metrics.json"
    bad.write_text("{not json")
    code, _, err = compare_cli(capsys, base, new)
    assert code == 2 and str(bad) in err and "not valid JSON" in err


def test_missing_metrics_json_of_a_passed_notebook_names_the_file(
    capsys, base: Path, tmp_path: Path
) -> None:
    new = make_run(tmp_path / "new")
    gone = new / DDP / "metrics.json"
    gone.unlink()
    code, _, err = compare_cli(capsys, base, new)
    assert code == 2 and str(gone) in err


def test_without_summary_a_folder_without_metrics_failed(
    capsys, base: Path, tmp_path: Path
) -> None:
    new = make_run(tmp_path / "new", summary=False)
    gone = new / DDP / "metrics.json"
    gone.unlink()
    code, out, _ = compare_cli(capsys, base, new)
    assert code == 1 and str(gone) in out and "failed" in out


def test_notebook_that_passed_and_now_fails_regresses(capsys, base: Path, tmp_path: Path) -> None:
    metrics = {**METRICS, DDP: None}
    new = make_run(tmp_path / "new", metrics, errors={DDP: "Traceback...\nValueError: nan loss"})
    code, out, _ = compare_cli(capsys, base, new)
    assert code == 1
    assert "(status)" in out and "failed" in out and "nan loss" in out


def test_notebook_missing_from_new_run_regresses(base: Path, tmp_path: Path) -> None:
    new = make_run(tmp_path / "new", {"00_environment": METRICS["00_environment"]})
    comparison = compare(base, new)
    assert row(comparison, "(notebook)").verdict == MISSING and comparison.regressed


def test_newly_skipped_section_regresses(base: Path, tmp_path: Path) -> None:
    new = make_run(tmp_path / "new")
    write_record(new / DDP, DDP, METRICS[DDP], skipped=[{"what": "bf16", "why": "no bf16"}])
    assert row(compare(base, new), "skipped: bf16").verdict == REGRESSED


def test_config_overrides_a_tolerance(capsys, base: Path, tmp_path: Path) -> None:
    new = make_run(tmp_path / "new", with_ddp(samples_per_s={"1": 1000.0, "2": 1260.0}))
    config = tmp_path / "tolerances.json"
    config.write_text(json.dumps({"rules": [{"match": "samples_per_s*", "rel_tol": 0.5}]}))
    code, out, _ = compare_cli(capsys, base, new, "--config", config)
    assert code == 0 and "drop > 50%" not in out  # within tolerance: hidden as unchanged
    per_notebook = {"notebooks": {DDP: {"rules": [{"match": "samples_per_s*", "rel_tol": 0.5}]}}}
    assert not compare(base, new, config=per_notebook).regressed


def test_config_can_tighten_a_bound(base: Path, tmp_path: Path) -> None:
    new = make_run(tmp_path / "new", with_ddp(max_param_diff=5e-8))
    config = {"rules": [{"match": "max_param_diff", "bound": 1e-8}]}
    assert row(compare(base, new, config=config), "max_param_diff").verdict == REGRESSED


@pytest.mark.parametrize(
    "text",
    ["{oops", '{"rules": [{"match": "x", "direction": "up"}]}', '{"rules": [{"pattern": "x"}]}'],
)
def test_bad_config_names_the_file(capsys, base: Path, tmp_path: Path, text: str) -> None:
    config = tmp_path / "bad.json"
    config.write_text(text)
    code, _, err = compare_cli(capsys, base, make_run(tmp_path / "new"), "--config", config)
    assert code == 2 and str(config) in err


def test_missing_run_directory_is_a_clear_error(capsys, base: Path, tmp_path: Path) -> None:
    code, _, err = compare_cli(capsys, base, tmp_path / "nope")
    assert code == 2 and "nope" in err and "not a run directory" in err


def test_cli_runs_as_a_module(base: Path, tmp_path: Path) -> None:
    new = make_run(tmp_path / "new", with_ddp(samples_per_s={"1": 1000.0, "2": 1260.0}))
    done = subprocess.run(
        [sys.executable, "-m", "labtools.report", "compare", str(base), str(new)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "REGRESSED" in done.stdout and "samples_per_s.2" in done.stdout


# ---------------------------------------------------------------- summary of one run


def tiny_png(path: Path) -> None:
    figure_module = pytest.importorskip("matplotlib.figure")
    fig = figure_module.Figure(figsize=(1, 1))
    fig.add_subplot().plot([0, 1], [1, 0])
    fig.savefig(path, dpi=20)


def test_summary_writes_markdown_and_self_contained_html(capsys, base: Path) -> None:
    tiny_png(base / DDP / "throughput.png")
    assert main([str(base)]) == 0
    out = capsys.readouterr().out
    assert "| notebook | status | seconds | hardware | key metrics | skipped |" in out
    assert DDP in out and "samples_per_s.2=1800" in out and "cpu with 0 GPUs" in out
    assert (base / "report.md").read_text().strip() == out.strip()
    page = (base / "report.html").read_text()
    assert "data:image/png;base64," in page and "throughput.png" in page
    assert "http://" not in page and "https://" not in page and "<script" not in page


def test_summary_shows_failed_notebook_and_works_without_summary_json(
    capsys, tmp_path: Path
) -> None:
    run = make_run(tmp_path / "run", {**METRICS, DDP: None}, summary=False)
    html_path, md_path = tmp_path / "page.html", tmp_path / "page.md"
    assert main([str(run), "--html", str(html_path), "--md", str(md_path)]) == 0
    out = capsys.readouterr().out
    assert "failed" in out and str(run / DDP / "metrics.json") in out
    assert html_path.exists() and md_path.exists() and not (run / "report.html").exists()
    data = summarize(run)
    statuses = {nb["notebook"]: nb["status"] for nb in data["notebooks"]}
    assert statuses == {"00_environment": "ok", DDP: "failed"}


def test_summary_reports_the_runner_error(capsys, tmp_path: Path) -> None:
    run = make_run(
        tmp_path / "run",
        {**METRICS, DDP: None},
        errors={DDP: "Traceback ...\nRuntimeError: NCCL timeout"},
    )
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "failed: RuntimeError: NCCL timeout" in out
    assert "NCCL timeout" in (run / "report.html").read_text()
