"""Notebook 04: the tuner's pick is measured against num_workers=0 in the same run, the bound is
reported, every training setting has its data wait fraction, and the common mistakes are shown,
not told.

No timing is asserted beyond what the measurements guarantee by construction (the tuner keeps the
fastest setting it measured, num_workers=0 included); the speed-ups themselves are reported, and
what the notebook says limits the loader is checked against the CPU times it measured.
"""

from __future__ import annotations

import math

import nbformat
import pytest

from helpers import cell_scripts, launch, loaders

STEM = "04_dataloader_tuning"


@pytest.fixture(scope="module")
def record(notebook_record):
    return notebook_record(STEM)


@pytest.fixture(scope="module")
def metrics(record):
    return record["metrics"]


def test_tuner_choice_is_at_least_as_fast_as_no_workers_in_the_same_run(metrics):
    trials = metrics["tuner_trials"]
    assert trials["w0"] is not None, "the tuner always measures num_workers=0 first"
    assert metrics["naive_samples_per_s_in_tuner"] == trials["w0"]
    assert metrics["tuned_samples_per_s_in_tuner"] == max(v for v in trials.values() if v)


def test_best_config_is_usable_as_loader_settings(metrics):
    best = metrics["best_config"]
    assert set(best) >= {"num_workers", "prefetch_factor", "persistent_workers"}
    assert isinstance(best["num_workers"], int) and best["num_workers"] >= 0
    assert best["persistent_workers"] is (best["num_workers"] > 0)
    if best["num_workers"]:
        assert isinstance(best["prefetch_factor"], int) and best["prefetch_factor"] >= 1
    else:
        assert best["prefetch_factor"] is None


def test_fraction_of_bound_and_speedup_are_reported_consistently(metrics):
    """The bound is what the cores prepared all at once with no loader (``cpu_capacity``),
    measured in alternation with both loaders; one core alone x cores is reported beside it."""
    naive, tuned = metrics["samples_per_s_naive"], metrics["samples_per_s_tuned"]
    bound = metrics["loader_upper_bound_samples_per_s"]
    assert naive > 0 and tuned > 0 and bound > 0
    assert math.isclose(metrics["fraction_of_bound"], tuned / bound, rel_tol=1e-9)
    ideal = metrics["loader_ideal_samples_per_s"]
    assert math.isclose(ideal, metrics["cores"] * naive, rel_tol=1e-9)
    assert math.isclose(metrics["fraction_of_ideal"], tuned / ideal, rel_tol=1e-9)
    assert math.isclose(metrics["effective_cores"], bound / naive, rel_tol=1e-9)
    assert metrics["effective_cores_in_section_4"] > 0
    speedup = metrics["speedup_best_vs_naive"]
    assert speedup > 0
    assert math.isclose(speedup, tuned / naive, rel_tol=1e-9)
    if metrics["best_config"]["num_workers"] == 0:
        assert speedup == 1.0, "the tuner kept num_workers=0: one setting, one rate"


GAP, NAMED = 0.9, 0.95  # the notebook's thresholds: a gap under 10 % is noise
BOUND_KEYS = ["cpu_time_together", "work_per_cpu_second"]
TUNED_KEYS = ["cpus_kept_busy", "work_in_loader"]
PHRASES = {  # how the verdict cell words each reason
    "cpu_time_together": "of a CPU, one alone",
    "work_per_cpu_second": "of the work it does alone",
    "cpus_kept_busy": "CPUs busy, the capacity run",
    "work_in_loader": "ms of CPU per batch",
}


def blamed(ratio, factors, keys):
    if ratio >= GAP:
        return []
    return [k for k in keys if factors[k] < NAMED] or [min(keys, key=factors.get)]


def test_the_factors_are_the_measured_cpu_times(metrics):
    """Each factor is a ratio of CPU time (read from the OS) measured side by side; bound / ideal
    is the product of the first two, tuned / bound of the last two (medians, so roughly)."""
    f, share, cpu = metrics["bound_factors"], metrics["cpu_share"], metrics["cpu_s_per_sample"]
    assert all(0 < share[k] <= 1.05 for k in ("alone", "together")), share
    assert all(v > 0 for v in cpu.values()) and metrics["cpus_busy_tuned"] > 0
    busy_in_capacity = metrics["cores"] * share["together"]
    assert math.isclose(f["cpu_time_together"], share["together"] / share["alone"], rel_tol=1e-9)
    assert math.isclose(f["work_per_cpu_second"], cpu["alone"] / cpu["together"], rel_tol=1e-9)
    assert math.isclose(f["cpus_kept_busy"], metrics["cpus_busy_tuned"] / busy_in_capacity)
    assert math.isclose(f["work_in_loader"], cpu["together"] / cpu["tuned"], rel_tol=1e-9)
    physical = metrics["physical_cores"]
    assert physical is None or 1 <= physical <= metrics["logical_cpus"]


def test_the_verdict_names_what_its_measurements_show(metrics, notebook_run):
    """What limits the loader is said from the factors, never assumed: no reason where the
    ratio is within the noise, and where it is not, the factors that fell."""
    f = metrics["bound_factors"]
    scaling = metrics["loader_upper_bound_samples_per_s"] / metrics["loader_ideal_samples_per_s"]
    assert metrics["bound_limited_by"] == blamed(scaling, f, BOUND_KEYS)
    assert metrics["tuned_limited_by"] == blamed(metrics["fraction_of_bound"], f, TUNED_KEYS)
    executed = nbformat.read(notebook_run(STEM).output, as_version=4)
    (cell,) = [c for c in executed.cells if c.get("id") == "99d2f319"]
    printed = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    assert ("cannot reach" in printed) == bool(metrics["bound_limited_by"]), printed
    assert ("The cores scale" in printed) == (not metrics["bound_limited_by"]), printed
    assert ("nothing left to tune" in printed) == (not metrics["tuned_limited_by"]), printed
    for key, phrase in PHRASES.items():
        named = key in metrics["bound_limited_by"] + metrics["tuned_limited_by"]
        assert (phrase in printed) == named, (key, printed)
    if "work_per_cpu_second" in metrics["bound_limited_by"]:
        physical = metrics["physical_cores"]
        smt = physical is not None and physical < metrics["logical_cpus"]
        assert ("SMT" in printed) == smt, printed


def test_every_knob_was_measured(metrics):
    rates = metrics["samples_per_s_by_config"]
    cores = metrics["cores"]
    assert {"w0", "w1", f"w{cores}", f"w{2 * cores}"} <= set(rates)
    assert {f"w{cores}_pf1", f"w{cores}_pf4", f"w{cores}_b16", f"w{cores}_b256"} <= set(rates)
    assert all(v > 0 for v in rates.values())
    assert set(metrics["first_batch_s_by_workers"]) >= {"0", "1", str(cores)}
    for n, mem in metrics["worker_memory_bytes"].items():
        assert mem["processes"] == int(n) and 0 < mem["pss"] <= mem["rss"], (n, mem)


def test_epoch_start_compares_start_methods_and_persistence(metrics):
    starts = metrics["epoch_start_s"]
    names = " | ".join(starts)
    assert "forkserver" in names and "spawn" in names and "persistent" in names
    assert any("forkserver" in k and "persistent" not in k for k in starts)
    for name, seconds in starts.items():
        assert len(seconds) == 2 and all(s > 0 for s in seconds), name
    assert metrics["spawn_worker_memory_bytes"]["processes"] >= 1
    assert metrics["forkserver_start_s"] > 0


def test_data_wait_fraction_per_training_setting(metrics):
    waits = metrics["data_wait_fraction"]
    assert set(waits) == set(metrics["training_samples_per_s_by_config"])
    assert "w0" in waits and len(waits) >= 3
    assert all(0 <= w <= 1 for w in waits.values()), waits
    assert metrics["step_bound_samples_per_s"] > 0 and metrics["training_bound_samples_per_s"] > 0


def test_pin_memory_is_measured_on_gpus_and_skipped_with_the_warning_elsewhere(record, metrics):
    pinned = [k for k in metrics["data_wait_fraction"] if k.endswith("_pin")]
    if record["hardware"]["gpu_count"]:
        assert pinned, "a GPU machine measures every setting with pin_memory too"
    else:
        assert not pinned
        assert "pin_memory" in (metrics["pin_memory_warning"] or "")
        skips = {s["what"]: s["why"] for s in record["skipped"]}
        assert "accelerator" in skips.get("pin_memory and non_blocking=True copies", "")


def test_tips_were_checked_not_told(metrics):
    assert metrics["augment_reproducible"] is True
    assert metrics["workers_draw_differently"] is True
    assert metrics["seed_changes_draws"] is True
    assert metrics["distributed_sampler_disjoint"] is True
    assert metrics["rule_of_thumb_workers"] >= 4
    swept = {int(k[1:]) for k in metrics["samples_per_s_by_config"] if "_" not in k}
    assert metrics["best_workers_in_sweep"] in swept


@pytest.mark.parametrize("cores", [1, 2, 16, 24, 64, 128])
def test_worker_sweeps_are_capped_so_the_warm_up_fits_the_slice(cores):
    """Up to 2 x cores but at most 32 workers: warm-up (workers x prefetch 2) + 40 timed batches
    of 64 must fit the 8,000-image slice (and its synthetic stand-in) on any machine."""
    most = loaders.sweep_max_workers(cores)
    assert 1 <= most <= 32 and most == min(2 * cores, 32)
    assert most * 2 + 40 <= 8000 // 64


def test_loader_train_refuses_a_sweep_its_shard_cannot_feed(tmp_path, no_orphans):
    """More warm-up batches than the shard holds: a clear error before any training, not a
    StopIteration half-way through the sweep."""
    cell_scripts.ensure_script(STEM, "work/loader_ddp.py", cwd=tmp_path)  # the core it imports
    script = cell_scripts.ensure_script(STEM, "work/loader_train.py", cwd=tmp_path)
    with pytest.raises(launch.WorkerFailed, match=r"needs 138 batches .* shard has \d+"):
        launch.torchrun(
            script,
            ["--workers", "0", "64", "--steps", "10"],
            nproc=1,
            device="cpu",
            out_dir=tmp_path / "out",
            max_lines=0,
            timeout=300,
        )


def test_the_core_script_trained_on_every_rank(record, metrics):
    """Section 1's loader_ddp.py: every rank read its shard with its workers and trained."""
    rates = metrics["core_samples_per_s"]
    assert len(rates) == record["hardware"]["nproc"]
    assert all(r > 0 for r in rates)


def test_the_exercises_run_a_job_and_pass(metrics):
    assert metrics["exercises"] == {"04.1": True, "04.2": True}
