"""DataLoader measurements for notebook 04: a dataset that costs what real images cost, honest
timing of a loader, worker memory, what the cores deliver at once (the loader's bound), and
``tune_loader``, a small autotuner.

The knobs themselves (``num_workers``, ``prefetch_factor``, ``persistent_workers``,
``pin_memory``, the start method of the workers) are the lesson and stay in the notebook; what
lives here is plumbing the notebook would otherwise repeat: a stopwatch around a loader, reading
psutil for the workers' memory and CPU time, the CPU topology, and the search loop of the tuner.

Spawned and forkserver workers import the dataset class by name, so it has to live in an
importable module like this one: a class defined in a notebook cell cannot be unpickled by them.
"""

from __future__ import annotations

import io
import math
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

from helpers.data import MNIST_MEAN, MNIST_STD  # the lessons' one normalisation
from helpers.procs import GONE


class CostlyMNIST(Dataset):
    """MNIST digits that cost what photographs cost: decode plus augmentation, per sample.

    A raw MNIST digit is a 784-byte array, so loading it is nearly free and no loader tuning
    would ever matter. Real pipelines read compressed images and augment them on the fly; this
    dataset does the same work on every ``__getitem__``: the digit is stored as a ``side`` x
    ``side`` picture, encoded and decoded (a PIL round trip, as reading a PNG file costs), then
    randomly rotated, shifted and scaled (``RandomAffine``), shrunk back to 28x28 and normalised.
    ``side`` sets the cost: 28 is cheap, 112 costs about as much as a small photo, 224 an
    ImageNet-sized one. The random augmentation draws from torch's generator, which the
    DataLoader seeds per worker, so a seeded loader gives the same batches on every run.
    """

    def __init__(self, images: Any, targets: Any, side: int = 112, degrees: float = 15.0):
        self.images = np.ascontiguousarray(np.asarray(images, dtype=np.uint8))  # N x 28 x 28
        self.targets = np.asarray(targets, dtype=np.int64)
        if self.images.ndim != 3 or len(self.images) != len(self.targets):
            raise ValueError(f"images must be N x H x W with N labels, got {self.images.shape}")
        self.side = int(side)
        self.augment = transforms.Compose(
            [
                transforms.RandomAffine(degrees, translate=(0.1, 0.1), scale=(0.9, 1.1)),
                transforms.Resize(28, antialias=True),
                transforms.ToTensor(),
                transforms.Normalize((MNIST_MEAN,), (MNIST_STD,)),
            ]
        )

    @classmethod
    def from_dataset(cls, dataset: Any, **kwargs: Any) -> CostlyMNIST:
        """Wrap torchvision's MNIST (or the kit's synthetic stand-in): both hold ``.data`` and
        ``.targets``; only the raw digits are kept, the original transform is not used."""
        data, targets = dataset.data, dataset.targets
        data = data.numpy() if hasattr(data, "numpy") else data
        targets = targets.numpy() if hasattr(targets, "numpy") else targets
        return cls(data, targets, **kwargs)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        picture = Image.fromarray(self.images[index]).resize((self.side, self.side))
        stored = io.BytesIO()
        picture.save(stored, format="PNG", compress_level=1)  # what the file on disk holds
        stored.seek(0)
        decoded = Image.open(stored)
        decoded.load()  # PIL decodes lazily: force the decode here, as training would
        return self.augment(decoded), int(self.targets[index])


class FailingDataset(Dataset):
    """A dataset whose every sample raises: how the tuner's skip-on-error path is shown/tested."""

    def __init__(self, length: int = 64):
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        raise RuntimeError(f"sample {index} cannot be read (FailingDataset)")


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` for libraries the DataLoader does not seed itself.

    The DataLoader already gives every worker its own torch seed (``base_seed + worker_id``,
    with ``base_seed`` drawn from the loader's ``generator``) and seeds Python's ``random`` and
    NumPy from it. Anything else that draws random numbers in a worker must be seeded from
    ``torch.initial_seed()`` here, or every worker (and every epoch) repeats the same draws.
    It must be importable (not defined in a notebook) for spawned and forkserver workers.
    """
    import random

    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


# ---------------------------------------------------------------- timing a loader


@dataclass
class LoaderTiming:
    """One measurement of a loader: the start of an epoch, then its steady state."""

    first_batch_s: float  # iter() to the first batch: worker start-up plus one batch
    samples_per_s: float  # after the warm-up batches: the rate an epoch runs at
    batches: int  # batches in the timed window
    samples: int  # samples in the timed window
    seconds: float  # length of the timed window
    warmup: int  # batches consumed (untimed) before the window opened
    worker_pids: list[int] = field(default_factory=list)
    worker_memory: dict[str, int] = field(default_factory=dict)  # see workers_memory()
    main_cpu_s: float = 0.0  # CPU time of this process during the timed window
    workers_cpu_s: float = 0.0  # CPU time of the worker processes during the timed window

    @property
    def cpus_busy(self) -> float:
        """How many CPUs the loader kept busy on average during the window (main + workers)."""
        return (self.main_cpu_s + self.workers_cpu_s) / self.seconds

    @property
    def cpu_s_per_sample(self) -> float:
        """CPU seconds the loader spent per sample (main + workers): its whole cost."""
        return (self.main_cpu_s + self.workers_cpu_s) / self.samples


def default_warmup(loader: DataLoader) -> int:
    """Batches to consume before timing: the ones workers already prefetched while the first
    batch was on its way (``num_workers * prefetch_factor``) would otherwise arrive for free and
    inflate the rate."""
    if loader.num_workers == 0:
        return 1
    return max(1, loader.num_workers * (loader.prefetch_factor or 2))


def timed_loader_throughput(
    loader: DataLoader,
    batches: int = 20,
    warmup: int | None = None,
    on_batch: Callable[[Any], None] | None = None,
) -> LoaderTiming:
    """Time ``batches`` batches of ``loader`` after ``warmup`` untimed ones.

    With workers, the timed batches are rounded down to whole rounds of the workers (at least
    one round): worker ``i`` makes batches ``i``, ``i + N``, ``i + 2N`` … and they arrive in
    order, so 15 batches from 2 workers take as long as 16, and a window that is not a whole
    number of rounds under-states the rate (by 1/16 there).

    ``on_batch`` is called with every batch (e.g. a copy to the GPU) inside the timing. Between
    the warm-up and the timed window, while the workers are alive and busy, their memory is read
    with psutil (outside the timing); the CPU time of this process and of the workers is read at
    both ends of the window. Raises ValueError when the loader is too short.
    """
    warmup = default_warmup(loader) if warmup is None else warmup
    per_round = max(1, loader.num_workers)
    batches = max(per_round, batches - batches % per_round)
    needed = warmup + batches
    if len(loader) < needed:
        raise ValueError(
            f"the loader has {len(loader)} batches, {needed} needed "
            f"({warmup} warm-up + {batches} timed): use a larger dataset"
        )
    start = time.perf_counter()
    iterator = iter(loader)
    pids: list[int] = []
    try:
        first = next(iterator)
        first_batch_s = time.perf_counter() - start
        if on_batch:
            on_batch(first)
        for _ in range(warmup - 1):
            batch = next(iterator)
            if on_batch:
                on_batch(batch)
        pids = worker_pids(iterator)
        memory = workers_memory(pids) if pids else {}
        samples = 0
        workers_cpu, main_cpu = cpu_seconds(pids), time.process_time()
        window = time.perf_counter()
        for _ in range(batches):
            batch = next(iterator)
            if on_batch:
                on_batch(batch)
            samples += _batch_len(batch)
        seconds = time.perf_counter() - window
        main_cpu = time.process_time() - main_cpu
        workers_cpu = cpu_seconds(pids) - workers_cpu
    finally:
        _close(iterator, loader, pids)
    return LoaderTiming(
        first_batch_s,
        samples / seconds,
        batches,
        samples,
        seconds,
        warmup,
        pids,
        memory,
        main_cpu_s=main_cpu,
        workers_cpu_s=workers_cpu,
    )


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU time used so far by the processes ``pids`` (those still alive)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except GONE:
            continue
        total += times.user + times.system
    return total


def worker_pids(loader_or_iterator: Any) -> list[int]:
    """PIDs of the worker processes behind a live iterator, or behind a loader with
    ``persistent_workers`` (which keeps its iterator). Reads ``_workers``, a private attribute of
    the multi-process iterator that has been stable since PyTorch 1.0; empty with no workers."""
    iterator = getattr(loader_or_iterator, "_iterator", loader_or_iterator)
    return [w.pid for w in getattr(iterator, "_workers", []) if w.pid is not None]


def _batch_len(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (list, tuple)) else batch
    return len(first)


def _close(iterator: Any, loader: DataLoader, pids: list[int]) -> None:
    """End the workers now instead of whenever the garbage collector gets to them, so the next
    measurement does not share the cores with a dying pool. A persistent loader keeps its
    workers for the next epoch (that is the point of ``persistent_workers``), but they go on
    making the batches already asked of them (up to ``prefetch_factor`` each): wait until they
    are idle, so the next measurement does not share the cores with them either."""
    if not loader.persistent_workers and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    elif pids:
        _wait_until_idle(pids)


def _wait_until_idle(pids: list[int], every_s: float = 0.05, timeout_s: float = 30.0) -> None:
    """Return once ``pids`` together used under a tenth of a CPU for ``every_s`` seconds (an
    idle DataLoader worker sleeps on its queue), or after ``timeout_s`` in any case."""
    deadline = time.perf_counter() + timeout_s
    before = cpu_seconds(pids)
    while time.perf_counter() < deadline:
        time.sleep(every_s)
        now = cpu_seconds(pids)
        if now - before < 0.1 * every_s:
            return
        before = now


def per_sample_seconds(dataset: Dataset, n: int = 200, start: int = 0) -> float:
    """The mean cost of ``dataset[i]`` in this process over ``n`` consecutive samples: what one
    core spends per sample, with no loader, no collation and no inter-process traffic."""
    begin = time.perf_counter()
    for i in range(start, start + n):
        dataset[i % len(dataset)]
    return (time.perf_counter() - begin) / n


def usable_cores() -> int:
    """CPU cores this process may run on: the affinity mask (which Slurm and ``taskset`` set),
    capped by a cgroup CPU quota (``docker run --cpus=2`` leaves the mask whole but lets the
    container use 2 CPUs' worth of time). These are *logical* CPUs: see :func:`cpu_topology`."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cpus = os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(cpus, math.ceil(quota))) if quota else cpus


def cpu_quota(root: str | Path = "/sys/fs/cgroup") -> float | None:
    """The cgroup CPU quota in CPUs (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), or None
    when there is none (or no cgroup file to read, as outside Linux)."""
    root = Path(root)
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]  # "max 100000" or "200000 …"
    except (OSError, ValueError):
        try:
            v1 = root / "cpu"
            quota = (v1 / "cpu.cfs_quota_us").read_text().strip()  # "-1": no quota
            period = (v1 / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    if quota in ("max", "-1") or not int(period):
        return None
    return int(quota) / int(period)


def cpu_topology(
    cpus: Iterable[int] | None = None, root: str | Path = "/sys/devices/system/cpu"
) -> dict[str, Any]:
    """How the usable logical CPUs map onto physical cores: ``logical``, ``physical`` and the
    groups of SMT siblings (``siblings``: logical CPUs that are hardware threads of one core,
    from ``thread_siblings_list``). Two siblings share one core's execution units, so two busy
    siblings do much less than twice the work of one. Where the kernel does not say (not
    Linux), ``physical`` comes from psutil for the whole machine, or is None."""
    if cpus is None:
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except AttributeError:
            cpus = range(os.cpu_count() or 1)
    cpus = sorted(cpus)
    groups: set[tuple[int, ...]] = set()
    for cpu in cpus:
        try:
            text = (Path(root) / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text()
        except OSError:
            groups = set()
            break
        groups.add(tuple(_cpu_list(text)))
    if groups:
        usable = set(cpus)
        siblings = sorted(tuple(c for c in g if c in usable) for g in groups)
        return {"logical": len(cpus), "physical": len(groups), "siblings": siblings}
    whole_machine = len(cpus) == (os.cpu_count() or 0)
    physical = psutil.cpu_count(logical=False) if whole_machine else None
    return {"logical": len(cpus), "physical": physical, "siblings": []}


def _cpu_list(text: str) -> list[int]:
    """``"0-3,8"`` (the kernel's CPU list format) -> ``[0, 1, 2, 3, 8]``."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


@dataclass
class CpuCapacity:
    """What ``processes`` processes preparing samples at the same time delivered, no loader."""

    processes: int
    samples_per_s: float  # all the processes together
    cpu_share: float  # CPU time each got per second, mean (1.0: a whole CPU each, unshared)
    cpu_s_per_sample: float  # CPU time one sample took, over all the processes
    seconds: float  # the common window


def cpu_capacity(
    dataset: Dataset,
    processes: int | None = None,
    seconds: float = 1.0,
    multiprocessing_context: Any = "forkserver",
    warmup: int = 3,
) -> CpuCapacity:
    """The most samples per second these CPUs can prepare: ``processes`` processes (default
    :func:`usable_cores`), each calling ``dataset[i]`` in a loop with one thread, as a
    DataLoader worker does, all at the same time, with no loader (no batches to collate or hand
    over). After ``warmup`` samples each, they start together at a barrier and each counts the
    samples it finishes in ``seconds``.

    One core's rate x cores assumes every core is as fast with all of them busy as alone. This
    measures it instead: it is lower when the CPUs are SMT siblings of fewer physical cores, when
    other processes (or the hypervisor) take CPU time, or when the clock drops with every core
    busy. ``cpu_share`` and ``cpu_s_per_sample`` tell those apart: the first falls when others
    take the CPUs, the second rises when each CPU-second does less work."""
    processes = processes or usable_cores()
    ctx = (
        mp.get_context(multiprocessing_context)
        if isinstance(multiprocessing_context, str) or multiprocessing_context is None
        else multiprocessing_context
    )
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    spread = max(1, len(dataset) // processes)  # each process starts at its own sample
    procs = [
        ctx.Process(
            target=_capacity_worker,
            args=(dataset, seconds, i * spread, warmup, barrier, results),
            daemon=True,
        )
        for i in range(processes)
    ]
    for proc in procs:
        proc.start()
    counts: list[tuple[int, float, float]] = []
    try:
        for _ in procs:
            got = results.get(timeout=120 + seconds)
            if isinstance(got, str):
                raise RuntimeError(f"cpu_capacity: a process failed: {got}")
            counts.append(got)
    finally:
        barrier.abort()  # a failed or late process must not leave the others waiting
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join()
    samples = sum(n for n, _, _ in counts)
    return CpuCapacity(
        processes=processes,
        samples_per_s=sum(n / wall for n, wall, _ in counts),
        cpu_share=statistics.mean(cpu / wall for _, wall, cpu in counts),
        cpu_s_per_sample=sum(cpu for _, _, cpu in counts) / max(1, samples),
        seconds=seconds,
    )


def _capacity_worker(
    dataset: Dataset, seconds: float, start: int, warmup: int, barrier: Any, results: Any
) -> None:
    """One process of :func:`cpu_capacity`: warm up, wait for the others, then count."""
    try:
        torch.set_num_threads(1)  # what the DataLoader sets in each of its workers
        size = len(dataset)
        for i in range(warmup):
            dataset[(start + i) % size]
        barrier.wait(timeout=120)
        wall, cpu, done = time.perf_counter(), time.process_time(), 0
        while (elapsed := time.perf_counter() - wall) < seconds:
            dataset[(start + warmup + done) % size]
            done += 1
        results.put((done, elapsed, time.process_time() - cpu))
    except Exception as exc:  # reported to the parent, which raises it
        results.put(f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------- memory of the workers


def process_memory(pid: int) -> dict[str, int]:
    """Resident memory of one process in bytes: ``rss`` (what ``top`` shows; pages shared with
    other processes count in full) and ``pss`` (shared pages divided among their sharers, so the
    ``pss`` of several processes adds up to what they really take together; where the OS does
    not report PSS, as on macOS, ``pss`` is the RSS)."""
    proc = psutil.Process(pid)
    try:
        full = proc.memory_full_info()  # reads smaps: PSS where the OS has it (Linux)
    except psutil.AccessDenied:
        full = proc.memory_info()
    return {"rss": full.rss, "pss": getattr(full, "pss", 0) or full.rss}


def workers_memory(pids: Iterable[int]) -> dict[str, int]:
    """The sum of :func:`process_memory` over the worker processes that are still alive."""
    total = {"rss": 0, "pss": 0, "processes": 0}
    for pid in pids:
        try:
            mem = process_memory(pid)
        except GONE:  # a worker that ended meanwhile
            continue
        total["rss"] += mem["rss"]
        total["pss"] += mem["pss"]
        total["processes"] += 1
    return total


# ---------------------------------------------------------------- the autotuner


@dataclass
class Trial:
    """One configuration the tuner tried: its throughput, or why it could not be measured."""

    config: dict[str, Any]
    samples_per_s: float | None = None
    first_batch_s: float | None = None
    seconds: float = 0.0  # wall time of the trial, start-up included
    error: str | None = None


@dataclass
class TuneResult:
    """What :func:`tune_loader` found: settings to pass to ``make_loader``/``DataLoader``."""

    best: dict[str, Any]
    samples_per_s: float  # the best setting's median over its trials
    baseline_samples_per_s: float | None  # num_workers=0, measured in the same run (median)
    by_config: dict[str, float | None]  # config_label -> median samples/s (None: it failed)
    trials: list[Trial]  # every measurement, in the order they ran
    seconds: float
    budget_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def config_label(config: dict[str, Any]) -> str:
    """A short stable name: ``w2_pf4`` (workers, prefetch), ``w0``, plus ``_b128`` if set."""
    label = f"w{config.get('num_workers', 0)}"
    if config.get("num_workers", 0) and config.get("prefetch_factor"):
        label += f"_pf{config['prefetch_factor']}"
    if "batch_size" in config:
        label += f"_b{config['batch_size']}"
    return label


def _measure(
    dataset: Dataset, batch_size: int, config: dict[str, Any], batches: int, context: Any, seed: int
) -> LoaderTiming:
    workers = config.get("num_workers", 0)
    loader = DataLoader(
        dataset,
        batch_size=config.get("batch_size", batch_size),
        shuffle=True,
        num_workers=workers,
        prefetch_factor=config.get("prefetch_factor") if workers else None,
        multiprocessing_context=context if workers else None,
        worker_init_fn=seed_worker if workers else None,
        generator=torch.Generator().manual_seed(seed),
    )
    return timed_loader_throughput(loader, batches=batches)


def tune_loader(
    dataset: Dataset,
    batch_size: int = 64,
    *,
    budget_s: float = 30.0,
    batches: int = 20,
    candidates: list[dict[str, Any]] | None = None,
    max_workers: int | None = None,
    prefetch_factors: tuple[int, ...] = (2, 4),
    confirm_rounds: int = 2,
    multiprocessing_context: Any = "forkserver",
    seed: int = 0,
    progress: Callable[[Trial], None] | None = None,
) -> TuneResult:
    """Try DataLoader settings for ``dataset`` within ``budget_s`` seconds; return the fastest.

    Why a search instead of a rule: the best worker count depends on the per-sample cost, the
    cores, what else runs, and the memory, so it is measured. The default search first measures
    ``num_workers=0`` (the baseline every choice is compared with), then one worker per usable
    core (the likeliest best, measured second in case the budget allows little more), then
    climbs the other worker counts 1, 2, 3, 4, 6, 8, 12 … up to ``max_workers`` (default 2 x
    usable cores, at most 32) and, once past the number of cores, stops climbing when a count is
    clearly slower (10 % below the best), then tries the other ``prefetch_factors`` on the best
    worker count. ``candidates`` replaces the search with a fixed list, tried in order.

    Why a confirmation: the largest of several noisy numbers is biased upwards, so budget left
    after the search re-measures the two fastest settings in alternation (``confirm_rounds``
    more each), and settings are ranked by the median of their measurements.

    Each trial times ``batches`` batches in steady state (see :func:`timed_loader_throughput`).
    The budget is checked before each trial, using the previous trial's length as the estimate,
    so the tuner stops early rather than late; the first trial always runs. A configuration that
    raises is recorded with its error and skipped. ``best`` holds ``num_workers``,
    ``prefetch_factor`` and ``persistent_workers`` (True with workers: start-up is paid once).
    """
    start = time.perf_counter()
    trials: list[Trial] = []

    def run(config: dict[str, Any]) -> Trial:
        began = time.perf_counter()
        trial = Trial(dict(config))
        try:
            timing = _measure(dataset, batch_size, config, batches, multiprocessing_context, seed)
            trial.samples_per_s, trial.first_batch_s = timing.samples_per_s, timing.first_batch_s
        except Exception as exc:  # a config that cannot run is skipped, with the reason kept
            trial.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
        trial.seconds = time.perf_counter() - began
        trials.append(trial)
        if progress:
            progress(trial)
        return trial

    def time_left_for_another() -> bool:
        elapsed = time.perf_counter() - start
        estimate = trials[-1].seconds if trials else 0.0
        return elapsed + estimate <= budget_s

    def ranked() -> list[tuple[float, dict[str, Any]]]:
        """(median samples/s, config) of every setting that ran, fastest first."""
        rates: dict[str, list[float]] = {}
        configs: dict[str, dict[str, Any]] = {}
        for t in trials:
            if t.samples_per_s is not None:
                rates.setdefault(config_label(t.config), []).append(t.samples_per_s)
                configs[config_label(t.config)] = t.config
        order = [(statistics.median(v), configs[k]) for k, v in rates.items()]
        return sorted(order, key=lambda pair: pair[0], reverse=True)

    if candidates is not None:
        for i, config in enumerate(candidates):
            if i and not time_left_for_another():
                break
            run(config)
    else:
        max_workers = max_workers if max_workers is not None else sweep_max_workers(usable_cores())
        cores = usable_cores()
        run({"num_workers": 0})
        per_core = min(cores, max_workers)
        ladder = [n for n in worker_ladder(max_workers) if n != per_core]
        failed_at = None
        for workers in ([per_core] if per_core > 0 else []) + ladder:
            if failed_at is not None and workers >= failed_at:
                continue  # e.g. out of memory or file handles: more workers will not fix it
            if not time_left_for_another():
                break
            trial = run({"num_workers": workers, "prefetch_factor": prefetch_factors[0]})
            if trial.samples_per_s is None:
                failed_at = workers
                continue
            best_rate = ranked()[0][0]
            if workers > cores and trial.samples_per_s < 0.9 * best_rate:
                break  # past the cores, a clearly slower count means the climb is over
        order = ranked()
        if order and order[0][1].get("num_workers"):
            for pf in prefetch_factors[1:]:
                if not time_left_for_another():
                    break
                run({"num_workers": order[0][1]["num_workers"], "prefetch_factor": pf})
    for _ in range(confirm_rounds):
        for _, config in ranked()[:2]:
            if not time_left_for_another():
                break
            run(config)

    order = ranked()
    if not order:
        reasons = "; ".join(f"{config_label(t.config)}: {t.error}" for t in trials)
        raise RuntimeError(f"no loader configuration could be measured ({reasons})")
    best_rate, best_config = order[0]
    chosen = dict(best_config)
    chosen.setdefault("prefetch_factor", None)
    chosen["persistent_workers"] = bool(chosen.get("num_workers"))
    by_config: dict[str, float | None] = {config_label(t.config): None for t in trials}
    by_config.update({config_label(c): rate for rate, c in order})
    baseline = by_config.get(config_label({"num_workers": 0}))
    return TuneResult(
        best=chosen,
        samples_per_s=float(best_rate),
        baseline_samples_per_s=baseline,
        by_config=by_config,
        trials=trials,
        seconds=time.perf_counter() - start,
        budget_s=budget_s,
    )


def sweep_max_workers(cores: int, cap: int = 32) -> int:
    """The most workers a lesson's sweep starts: twice the cores, to show the knee past them,
    but at most ``cap``, so that a 128-core server does not start hundreds of processes for
    one setting, nor prefetch more warm-up batches than the 8,000-image slice holds."""
    return max(1, min(2 * cores, cap))


def worker_ladder(max_workers: int) -> list[int]:
    """Worker counts worth trying: every count up to 4, then steps of about 1.5x (6, 8, 12, 16,
    24 …), always ending at ``max_workers``; a 64-core machine needs no 128 separate trials."""
    steps = {1, 2, 3} | {p for k in range(2, 12) for p in (2**k, 3 * 2 ** (k - 1))}
    return [n for n in sorted(steps) if n < max_workers] + ([max_workers] if max_workers else [])
