"""helpers.loaders: the costly dataset, the loader stopwatch, worker memory and tune_loader.

Timings are never asserted (CONTRIBUTING: no timed assertions); what is checked is what the
helpers promise regardless of speed: shapes, seeding, the search order, the budget as an upper
limit with generous slack, and that a configuration that raises is skipped with its reason.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time

import pytest
import torch
from torch.utils.data import DataLoader

from helpers import loaders
from helpers.data import SyntheticMNIST, make_loader


@pytest.fixture(scope="module")
def tiny() -> loaders.CostlyMNIST:
    """128 synthetic digits stored at 32 px: cheap enough for unit tests."""
    return loaders.CostlyMNIST.from_dataset(SyntheticMNIST(size=128), side=32)


@pytest.fixture(scope="module")
def forkserver():
    """The tuner's default start method; the server is stopped afterwards so no process is left
    running after this module (it would otherwise live until the test session ends)."""
    mp.set_forkserver_preload(["torch", "torchvision", "helpers.loaders"])
    yield "forkserver"
    from multiprocessing import forkserver as fs

    fs._forkserver._stop()  # private, but the only way to end the server before exit


def test_costly_mnist_gives_normalised_28x28_and_is_seeded(tiny):
    x, y = tiny[3]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and isinstance(y, int)
    assert y == int(tiny.targets[3])
    torch.manual_seed(0)
    a = tiny[3][0]
    torch.manual_seed(0)
    b = tiny[3][0]
    c = tiny[3][0]
    assert torch.equal(a, b), "the augmentation draws from torch's generator"
    assert not torch.equal(b, c), "a new draw gives another augmentation"


def test_costly_mnist_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="N x H x W"):
        loaders.CostlyMNIST(torch.zeros(4, 28, 28, dtype=torch.uint8).numpy(), [0, 1, 2])


def test_timed_loader_throughput_counts_what_it_timed(tiny):
    loader = DataLoader(tiny, batch_size=16)
    timing = loaders.timed_loader_throughput(loader, batches=4)
    assert timing.batches == 4 and timing.samples == 64 and timing.warmup == 1
    assert timing.samples_per_s > 0 and timing.first_batch_s > 0 and timing.seconds > 0
    assert timing.worker_pids == [] and timing.worker_memory == {}
    assert timing.workers_cpu_s == 0 and timing.main_cpu_s > 0, "the main process did the work"
    assert timing.cpu_s_per_sample == timing.main_cpu_s / 64


def test_timed_loader_throughput_refuses_a_short_loader(tiny):
    with pytest.raises(ValueError, match="batches"):
        loaders.timed_loader_throughput(DataLoader(tiny, batch_size=64), batches=4)


def test_default_warmup_covers_the_prefetched_batches(tiny):
    assert loaders.default_warmup(DataLoader(tiny, batch_size=8)) == 1
    loader = DataLoader(tiny, batch_size=8, num_workers=2, prefetch_factor=4)
    assert loaders.default_warmup(loader) == 8


@pytest.mark.job  # worker processes through the forkserver, which outlives the test by design
def test_timed_window_is_whole_rounds_of_the_workers_and_counts_their_cpu(tiny, forkserver):
    """Worker i makes batches i, i + N, ...: 5 batches from 2 workers would take as long as 6,
    so 4 are timed; the workers' CPU time over the window is read from the OS (it can be 0 here:
    the workers may have made these cheap, prefetched batches before the window opened)."""
    loader = DataLoader(tiny, batch_size=8, num_workers=2, multiprocessing_context=forkserver)
    timing = loaders.timed_loader_throughput(loader, batches=5)
    assert timing.batches == 4 and timing.samples == 32 and timing.warmup == 4
    assert timing.workers_cpu_s >= 0 and timing.main_cpu_s >= 0
    assert timing.cpus_busy == (timing.main_cpu_s + timing.workers_cpu_s) / timing.seconds
    one_round = loaders.timed_loader_throughput(loader, batches=1)
    assert one_round.batches == 2, "at least one round: every worker delivers once"


def test_cpu_seconds_reads_the_os_and_skips_ended_processes():
    before = loaders.cpu_seconds([os.getpid()])
    deadline = time.process_time() + 0.1
    while time.process_time() < deadline:  # 100 ms of CPU work in this process
        pass
    # the OS counts in clock ticks (10 ms): each of the two readings may be a tick short
    assert loaders.cpu_seconds([os.getpid()]) - before >= 0.1 - 0.025
    assert loaders.cpu_seconds([2**22 + 7]) == 0.0  # no such process: counted as nothing


def test_persistent_workers_are_left_to_finish_their_queued_batches(monkeypatch):
    """After a window, persistent workers still make the batches already asked of them: the
    next measurement starts only once they are idle (their CPU time stops growing)."""
    readings = iter([0.0, 0.2, 0.4, 0.5, 0.5])  # busy, busy, finishing, idle
    monkeypatch.setattr(loaders, "cpu_seconds", lambda pids: next(readings))
    loaders._wait_until_idle([1, 2], every_s=0.001)
    assert next(readings, "all read") == "all read", "it waited for the idle reading"
    monkeypatch.setattr(loaders, "cpu_seconds", lambda pids: time.perf_counter())  # never idle
    started = time.perf_counter()
    loaders._wait_until_idle([1], every_s=0.001, timeout_s=0.05)
    assert time.perf_counter() - started < 5, "a pool that never settles is not waited for"


def test_cpu_list_parses_the_kernels_format():
    assert loaders._cpu_list("0-3,8\n") == [0, 1, 2, 3, 8]
    assert loaders._cpu_list("5") == [5]


def _fake_cpus(root, siblings: dict[int, str]):
    for cpu, text in siblings.items():
        folder = root / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "thread_siblings_list").write_text(text + "\n")
    return root


def test_cpu_topology_counts_smt_siblings_once(tmp_path):
    """4 logical CPUs that are 2 cores with 2 threads each (siblings 0,2 and 1,3)."""
    root = _fake_cpus(tmp_path, {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"})
    whole = loaders.cpu_topology([0, 1, 2, 3], root=root)
    assert whole == {"logical": 4, "physical": 2, "siblings": [(0, 2), (1, 3)]}
    pair = loaders.cpu_topology([0, 2], root=root)  # taskset -c 0,2: two threads of one core
    assert pair == {"logical": 2, "physical": 1, "siblings": [(0, 2)]}
    apart = loaders.cpu_topology([0, 1], root=root)  # one thread of each core
    assert apart["physical"] == 2 and apart["siblings"] == [(0,), (1,)]


def test_cpu_topology_of_this_machine_is_consistent():
    topo = loaders.cpu_topology()
    assert topo["logical"] >= 1
    assert topo["physical"] is None or 1 <= topo["physical"] <= topo["logical"]


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "max 100000"}, None),
        ({"cpu.max": "150000 100000"}, 1.5),
        ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
        ({"cpu/cpu.cfs_quota_us": "200000", "cpu/cpu.cfs_period_us": "100000"}, 2.0),
        ({}, None),
    ],
)
def test_cpu_quota_reads_cgroup_v2_and_v1(tmp_path, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    assert loaders.cpu_quota(tmp_path) == quota


def test_usable_cores_is_capped_by_a_cpu_quota(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(loaders, "cpu_quota", lambda: None)
    assert loaders.usable_cores() == 8
    monkeypatch.setattr(loaders, "cpu_quota", lambda: 1.5)  # docker run --cpus=1.5
    assert loaders.usable_cores() == 2
    monkeypatch.setattr(loaders, "cpu_quota", lambda: 0.2)
    assert loaders.usable_cores() == 1


@pytest.mark.job  # processes through the forkserver, which outlives the test by design
def test_cpu_capacity_runs_the_processes_together_and_ends_them(tiny, forkserver):
    capacity = loaders.cpu_capacity(tiny, 2, seconds=0.3, multiprocessing_context=forkserver)
    assert capacity.processes == 2 and capacity.seconds == 0.3
    assert capacity.samples_per_s > 0 and capacity.cpu_s_per_sample > 0
    assert 0 < capacity.cpu_share <= 1.05, "a process cannot use more than its one thread's CPU"
    assert not mp.active_children(), "every process has ended"


@pytest.mark.job
def test_cpu_capacity_reports_a_failing_dataset(forkserver):
    with pytest.raises(RuntimeError, match="cannot be read"):
        loaders.cpu_capacity(
            loaders.FailingDataset(8), 2, seconds=0.1, multiprocessing_context=forkserver
        )
    assert not mp.active_children(), "every process has ended"


def test_process_memory_of_this_process():
    mem = loaders.process_memory(os.getpid())
    assert mem["rss"] > 0 and 0 < mem["pss"] <= mem["rss"] * 1.01
    assert loaders.workers_memory([os.getpid(), 2**22 + 12345])["processes"] == 1


def test_worker_ladder():
    assert loaders.worker_ladder(0) == []
    assert loaders.worker_ladder(2) == [1, 2]
    assert loaders.worker_ladder(4) == [1, 2, 3, 4]
    assert loaders.worker_ladder(16) == [1, 2, 3, 4, 6, 8, 12, 16]


def test_config_label():
    assert loaders.config_label({"num_workers": 0, "prefetch_factor": 4}) == "w0"
    assert loaders.config_label({"num_workers": 2, "prefetch_factor": 4}) == "w2_pf4"
    assert loaders.config_label({"num_workers": 1, "batch_size": 16}) == "w1_b16"


def test_tune_loader_returns_a_candidate_and_skips_one_that_raises(tiny):
    candidates = [
        {"num_workers": 0},
        {"num_workers": -1},  # DataLoader refuses it: the tuner must skip it, with the reason
        {"num_workers": 0, "batch_size": 8},
    ]
    result = loaders.tune_loader(tiny, 16, budget_s=60, batches=3, candidates=candidates)
    assert [t.config for t in result.trials][:3] == candidates
    assert all(t.config != candidates[1] for t in result.trials[3:]), "a failed one is not retried"
    failed = result.trials[1]
    assert failed.samples_per_s is None and "num_workers" in failed.error
    assert "ValueError" in failed.error
    chosen = {
        k: v for k, v in result.best.items() if k not in ("prefetch_factor", "persistent_workers")
    }
    assert chosen in [candidates[0], candidates[2]]
    assert result.by_config["w-1"] is None
    assert result.samples_per_s == max(v for v in result.by_config.values() if v is not None)
    w0 = [t.samples_per_s for t in result.trials if t.config == candidates[0]]
    assert result.baseline_samples_per_s == statistics.median(w0)
    assert result.best["persistent_workers"] is False and result.best["prefetch_factor"] is None


def test_tune_loader_respects_its_budget_roughly(tiny):
    """A budget far shorter than the candidate list: it stops early, after at least one trial.
    The bound is generous (no timing assertion about the machine, only about the stopping)."""
    candidates = [{"num_workers": 0, "batch_size": 16}] * 50
    started = time.perf_counter()
    result = loaders.tune_loader(tiny, budget_s=0.3, batches=4, candidates=candidates)
    elapsed = time.perf_counter() - started
    assert 1 <= len(result.trials) < 50
    assert result.seconds <= elapsed
    assert elapsed < 0.3 + 30, "one trial past the budget at most, with slack for a busy machine"


def test_tune_loader_raises_when_nothing_runs():
    with pytest.raises(RuntimeError, match="no loader configuration"):
        loaders.tune_loader(
            loaders.FailingDataset(64), 8, budget_s=10, batches=2, candidates=[{"num_workers": 0}]
        )


def _fake_measure(rates: dict[int, float], seen: list[int] | None = None):
    """A stand-in for ``loaders._measure``: samples/s by worker count, no processes started."""

    def measure(dataset, batch_size, config, batches, context, seed):
        workers = config.get("num_workers", 0)
        if seen is not None:
            seen.append(workers)
        if rates[workers] is None:
            raise OSError(f"too many open files with {workers} workers")
        return loaders.LoaderTiming(0.1, rates[workers], batches, batches * batch_size, 1.0, 1)

    return measure


def test_tune_loader_measures_one_worker_per_core_right_after_the_baseline(monkeypatch, tiny):
    """Under a budget that allows few trials, the likeliest best (one worker per core) comes
    first; then the rest of the ladder, then a deeper prefetch on the best count."""
    monkeypatch.setattr(loaders, "usable_cores", lambda: 2)
    rates = {0: 100.0, 1: 100.0, 2: 200.0, 3: 190.0, 4: 150.0}
    monkeypatch.setattr(loaders, "_measure", _fake_measure(rates))
    result = loaders.tune_loader(tiny, 8, budget_s=60, max_workers=4, confirm_rounds=0)
    labels = [loaders.config_label(t.config) for t in result.trials]
    assert labels == ["w0", "w2_pf2", "w1_pf2", "w3_pf2", "w4_pf2", "w2_pf4"], labels
    assert result.best["num_workers"] == 2


def test_tune_loader_stops_the_climb_at_a_failure_but_tries_fewer_workers(monkeypatch, tiny):
    monkeypatch.setattr(loaders, "usable_cores", lambda: 4)
    seen: list[int] = []
    rates = {0: 100.0, 1: 150.0, 2: 250.0, 3: 300.0, 4: None, 6: 500.0, 8: 500.0}
    monkeypatch.setattr(loaders, "_measure", _fake_measure(rates, seen))
    result = loaders.tune_loader(tiny, 8, budget_s=60, max_workers=8, confirm_rounds=0)
    assert seen[:5] == [0, 4, 1, 2, 3] and not {6, 8} & set(seen), seen
    assert result.by_config["w4_pf2"] is None and result.best["num_workers"] == 3


@pytest.mark.job  # worker processes through the forkserver, which outlives the test by design
def test_tune_loader_default_search_with_workers(tiny, forkserver):
    """The default search: the baseline first, then the worker ladder, then a deeper prefetch on
    the best count; the result plugs into DataLoader, persistent when it has workers."""
    seen = []
    result = loaders.tune_loader(
        tiny,
        8,
        budget_s=120,
        batches=3,
        max_workers=1,
        prefetch_factors=(2, 3),
        multiprocessing_context=forkserver,
        progress=seen.append,
    )
    labels = [loaders.config_label(t.config) for t in result.trials]
    assert labels[:2] == ["w0", "w1_pf2"], labels
    assert seen == result.trials
    assert all(t.error is None for t in result.trials), [t.error for t in result.trials]
    if "w1_pf3" in labels:  # tried only when w1 led after the climb, and right after it
        assert labels[2] == "w1_pf3", labels
    assert set(labels) <= {"w0", "w1_pf2", "w1_pf3"}, "confirmations measure no new setting"
    assert len(labels) <= 3 + 2 * 2, "two confirmation rounds of the two fastest at most"
    assert result.best["persistent_workers"] is (result.best["num_workers"] > 0)
    assert result.samples_per_s >= result.baseline_samples_per_s
    loader = make_loader(tiny, 8, multiprocessing_context=forkserver, **result.best)
    assert sum(len(y) for _, y in loader) == len(tiny)
    del loader


def test_seed_worker_is_importable_and_seeds_from_torch():
    import random

    import numpy as np

    torch.manual_seed(1234)
    loaders.seed_worker(0)
    a = (random.random(), np.random.rand())
    torch.manual_seed(1234)
    loaders.seed_worker(0)
    assert (random.random(), np.random.rand()) == a
