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


def test_timed_loader_throughput_refuses_a_short_loader(tiny):
    with pytest.raises(ValueError, match="batches"):
        loaders.timed_loader_throughput(DataLoader(tiny, batch_size=64), batches=4)


def test_default_warmup_covers_the_prefetched_batches(tiny):
    assert loaders.default_warmup(DataLoader(tiny, batch_size=8)) == 1
    loader = DataLoader(tiny, batch_size=8, num_workers=2, prefetch_factor=4)
    assert loaders.default_warmup(loader) == 8


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
