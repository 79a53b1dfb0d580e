"""MNIST for the lessons: real data whenever it can be had, a loud synthetic stand-in when not.

Getting data is not the lesson, so it lives here; the DataLoader knobs *are* a lesson (workers,
pinned memory, prefetching), so ``make_loader`` passes them through unchanged for notebooks to tune.

The order is fixed so that a run says which data it used: files already on disk (read with
``download=False``, which also works offline and on the shared slice whose MD5s differ from
torchvision's), else a download, else a synthetic set of the same shape with a banner that says
so. The returned ``kind`` ("mnist" or "synthetic") belongs in ``metrics.json``.

The files are read here (the idx format is a header and raw bytes) and normalised as tensors, so
a training script's processes do not import torchvision (1.75 s each with torch._dynamo behind
it, benchmarks/launch_cost.py): every torchrun launch starts that much sooner. torchvision is
imported only to download, or when a caller passes its own transform (which gets a PIL image, as
torchvision's MNIST gives).
"""

from __future__ import annotations

import math
import os
import socket
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

DATA_ENV = "MULTIGPU_LAB_DATA"
from helpers.paths import REPO_ROOT

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
RAW_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
DOWNLOAD_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 3.0  # per mirror: an offline machine falls back to synthetic in seconds
IDX_MAGIC = {"images": 0x803, "labels": 0x801}  # the idx format's magic number per file kind


class SyntheticDataWarning(UserWarning):
    """Raised (as a warning) when the lesson runs on made-up digits instead of MNIST."""


class CorruptDataError(ValueError):
    """An MNIST file on disk is damaged (a copy cut short, a download interrupted)."""


def data_root(root: str | Path | None = None) -> Path:
    """Where MNIST lives: the argument, else $MULTIGPU_LAB_DATA (CI points it at the shared
    offline slice), else ``<repo>/data`` so every notebook finds the same download."""
    if root is None:
        root = os.environ.get(DATA_ENV) or REPO_ROOT / "data"
    return Path(root).expanduser().resolve()


def default_transform() -> Callable[[Any], torch.Tensor]:
    """The usual MNIST normalisation, for PIL images; centred inputs let plain SGD train in one
    epoch. The datasets here apply the same arithmetic to tensors when given no transform."""
    from torchvision import transforms

    return transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))]
    )


def normalise(digits: torch.Tensor) -> torch.Tensor:
    """uint8 28x28 digits -> float 1x28x28, bit for bit what ToTensor + Normalize give."""
    return ((digits.to(torch.float32) / 255 - MNIST_MEAN) / MNIST_STD).unsqueeze(-3)


class Digits(Dataset):
    """Digits held as one uint8 tensor (``data``) with their labels (``targets``).

    With no ``transform`` a sample is the normalised tensor; with one, the transform gets a PIL
    image, as torchvision's MNIST does, so augmentation pipelines work unchanged.
    """

    classes = [str(i) for i in range(10)]

    def __init__(
        self,
        data: torch.Tensor,
        targets: torch.Tensor,
        train: bool,
        transform: Callable[[Any], Any] | None = None,
    ):
        self.data, self.targets, self.train, self.transform = data, targets, train, transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        if self.transform is None:
            return normalise(self.data[index]), int(self.targets[index])
        return self.transform(Image.fromarray(self.data[index].numpy())), int(self.targets[index])


def _words(header: bytes) -> list[int]:
    """The big-endian 4-byte integers an idx header is made of: the magic, then the sizes."""
    return [int.from_bytes(header[i : i + 4], "big") for i in range(0, len(header) - 3, 4)]


def read_idx(path: Path) -> torch.Tensor:
    """An idx file (MNIST's format: magic, sizes, then bytes) as a uint8 tensor of its shape."""
    raw = path.read_bytes()
    dims = raw[3]  # the magic's last byte: how many 4-byte sizes follow
    body = bytearray(raw[4 + 4 * dims :])  # writable: torch.frombuffer shares the memory
    return torch.frombuffer(body, dtype=torch.uint8).reshape(_words(raw[4 : 4 + 4 * dims]))


def read_mnist(root: Path, train: bool, transform: Callable[[Any], Any] | None) -> Digits:
    """The split's files under ``root/MNIST/raw``, refused by name if one is damaged."""
    check_raw_files(root)
    prefix = "train" if train else "t10k"
    raw = root / "MNIST" / "raw"
    images = read_idx(raw / f"{prefix}-images-idx3-ubyte")
    labels = read_idx(raw / f"{prefix}-labels-idx1-ubyte").long()
    return Digits(images, labels, train, transform)


def mnist_present(root: str | Path | None = None) -> bool:
    """True when MNIST's four files are under ``root`` (read without touching the network)."""
    raw = data_root(root) / "MNIST" / "raw"
    return all((raw / name).is_file() for name in RAW_FILES)


def check_raw_files(root: str | Path | None = None) -> None:
    """Refuse a damaged MNIST file by name, before reading it fails with a shape error.

    Each idx file says in its header how many items of which shape it holds; a file cut short
    (an interrupted copy or download) is shorter than its header promises.
    """
    raw = data_root(root) / "MNIST" / "raw"
    for name in RAW_FILES:
        path = raw / name
        kind = "images" if "images" in name else "labels"
        header_len = 16 if kind == "images" else 8  # magic, count (, rows, cols): 4 bytes each
        with path.open("rb") as f:
            header = f.read(header_len)
        words = _words(header)
        size, promised = path.stat().st_size, header_len + math.prod(words[1:])
        if len(header) < header_len or words[0] != IDX_MAGIC[kind]:
            problem = f"it does not start with an MNIST {kind} header"
        elif size != promised:
            problem = f"it has {size:,} bytes where its header promises {promised:,}"
        else:
            continue
        raise CorruptDataError(
            f"{path} is damaged: {problem}. Delete it (and its .gz) and run again to download "
            f"it, or copy it again from a good MNIST/raw folder."
        )


class SyntheticMNIST(Digits):
    """Made-up 1x28x28 'digits' so the code paths still run with neither data nor network.

    Each class is a fixed blocky pattern, shifted, dimmed and noised per sample: a CNN learns it
    well above chance, so a lesson's curves still move, but the numbers are not MNIST numbers.
    Deterministic: the same ``seed`` gives the same images on every rank and every run.
    """

    def __init__(
        self,
        train: bool = True,
        size: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        seed: int = 0,
    ):
        size = size if size is not None else (8000 if train else 2000)
        templates = torch.rand(10, 7, 7, generator=torch.Generator().manual_seed(seed)) > 0.6
        templates = templates.float().repeat_interleave(4, 1).repeat_interleave(4, 2)
        gen = torch.Generator().manual_seed(seed + (1 if train else 2))
        targets = torch.randint(0, 10, (size,), generator=gen)
        shifts = torch.randint(-2, 3, (size, 2), generator=gen).tolist()
        ink = 0.5 + 0.5 * torch.rand(size, 1, 1, generator=gen)
        images = torch.stack(
            [templates[int(y)].roll(tuple(s), (0, 1)) for y, s in zip(targets, shifts, strict=True)]
        )
        noise = 0.6 * torch.randn(size, 28, 28, generator=gen)
        data = ((images * ink + noise).clamp(0, 1) * 255).to(torch.uint8)
        super().__init__(data, targets, train, transform)


def _mirror_reachable() -> bool:
    """Whether a TCP connection to one of torchvision's MNIST mirrors opens within seconds.

    Without it an offline machine whose network drops packets (rather than refusing) waits for
    every mirror and file in turn. Behind a proxy the mirrors are not reachable directly, so the
    download itself is left to find out.
    """
    if urllib.request.getproxies():
        return True
    from torchvision import datasets  # only on the way to a download

    for url in datasets.MNIST.mirrors:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            with socket.create_connection((parts.hostname, port), timeout=PROBE_TIMEOUT_S):
                return True
        except OSError:
            continue
    return False


def _download(root: Path) -> None:
    """torchvision's download (both splits), with a short socket timeout so that an offline
    machine fails in seconds instead of hanging the first cell."""
    if not _mirror_reachable():
        raise ConnectionError(f"no MNIST mirror answered within {PROBE_TIMEOUT_S:g} s (offline?)")
    from torchvision import datasets

    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        datasets.MNIST(root, train=True, download=True)
    finally:
        socket.setdefaulttimeout(previous)


_ANNOUNCED: set[str] = set()  # roots this process has printed the banner for


def _announce_synthetic(root: Path, why: str) -> None:
    """A warning each time, the banner once per process and, in a torchrun job, on rank 0 only:
    a job that loads train and test on every rank said it eight times around one line."""
    message = (
        f"SYNTHETIC DATA: no MNIST in {root / 'MNIST' / 'raw'} and {why}. Accuracy and "
        f"throughput below are NOT MNIST results. To fix: run once with internet access, "
        f"or copy the MNIST raw files there, or set {DATA_ENV} to a folder holding "
        f"MNIST/raw (CI uses ../shared/data)."
    )
    if str(root) not in _ANNOUNCED and os.environ.get("RANK", "0") == "0":
        _ANNOUNCED.add(str(root))
        bar = "!" * 78
        print(f"{bar}\n{message}\n{bar}", flush=True)
    warnings.warn(message, SyntheticDataWarning, stacklevel=3)


def load_mnist(
    root: str | Path | None = None,
    train: bool = True,
    download: bool | None = None,
    transform: Callable[[Any], Any] | None = None,
) -> tuple[Dataset, str]:
    """The MNIST split, and the kind of data actually used ("mnist" or "synthetic").

    ``download``: None tries files, then the network, then synthetic data; False never touches
    the network (files or synthetic); True insists on real data and raises if it cannot get it.
    """
    root = data_root(root)
    if mnist_present(root):
        return read_mnist(root, train, transform), "mnist"
    why = "downloading was switched off (download=False)"
    if download is not False:
        try:
            _download(root)
            return read_mnist(root, train, transform), "mnist"
        except Exception as exc:  # offline, proxy, full disk: all end in the same fallback
            if download:
                raise RuntimeError(f"Could not download MNIST into {root}: {exc}") from exc
            why = f"the download failed ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    _announce_synthetic(root, why)
    return SyntheticMNIST(train=train, transform=transform), "synthetic"


def _collective_device() -> torch.device:
    """Where a small collective's tensor must live: this rank's GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _agree_on_kind(kind: str) -> None:
    """Fail loudly if ranks ended up with different data: their gradients would mean nothing."""
    real = torch.tensor([int(kind == "mnist")], device=_collective_device())
    dist.all_reduce(real)
    if 0 < int(real.item()) < dist.get_world_size():
        raise RuntimeError(
            f"Ranks disagree on the data: {int(real.item())} of "
            f"{dist.get_world_size()} have real MNIST. Put MNIST under "
            f"{DATA_ENV} on every node (or none) and run again."
        )


def mnist_once(
    root: str | Path | None = None,
    train: bool = True,
    download: bool | None = None,
    transform: Callable[[Any], Any] | None = None,
) -> tuple[Dataset, str]:
    """``load_mnist`` for multi-process scripts: never two downloads into one folder at once.

    Every rank downloading into the same folder at once races and corrupts the files, and the
    nodes of a cluster job often share that folder (NFS, Lustre), so one download per *node*
    still races. In turns, then: global rank 0 prepares the data while every other rank waits
    (the broadcast of what it got doubles as the barrier); then local rank 0 of each other node
    looks again, finds the files when the folder is shared, and downloads into its own disk
    when it is not (only if rank 0 got real data: an offline job stays synthetic everywhere);
    then everyone else reads with download=False. The waiting ranks sit in a collective, so the
    process group's timeout must exceed the download. Under NCCL call
    ``torch.cuda.set_device(local_rank)`` first, as every DDP script does.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return load_mnist(root, train, download, transform)
    loaded = load_mnist(root, train, download, transform) if dist.get_rank() == 0 else None
    real = torch.tensor(
        [int(loaded is not None and loaded[1] == "mnist")], device=_collective_device()
    )
    dist.broadcast(real, src=0)  # everyone waits here until rank 0 has the data
    if loaded is None and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        loaded = load_mnist(root, train, download if real.item() else False, transform)
    dist.barrier()  # the other nodes' first ranks are done too
    if loaded is None:
        with warnings.catch_warnings():  # rank 0 already said it loudly
            warnings.simplefilter("ignore", SyntheticDataWarning)
            loaded = load_mnist(root, train, False, transform)
    _agree_on_kind(loaded[1])
    return loaded


def make_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool = True,
    num_workers: int = 0,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    sampler: Sampler | None = None,
    seed: int = 0,
    drop_last: bool = False,
    worker_init_fn: Callable[[int], None] | None = None,
    multiprocessing_context: str | None = None,
) -> DataLoader:
    """The one DataLoader factory the notebooks tune, seeded so two runs see the same batches.

    ``prefetch_factor`` only means something with worker processes, so it is dropped when
    ``num_workers`` is 0 (a sweep over worker counts can keep it fixed). ``persistent_workers``
    with no workers is a contradiction and raises. With a ``sampler`` (DistributedSampler), the
    sampler owns the order and ``shuffle`` is ignored.
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if persistent_workers and num_workers == 0:
        raise ValueError(
            "persistent_workers=True keeps worker processes alive between epochs, "
            "but num_workers=0 starts none: set num_workers > 0 or drop it."
        )
    extra: dict[str, Any] = {}
    if num_workers > 0:
        extra = {
            "persistent_workers": persistent_workers,
            "multiprocessing_context": multiprocessing_context,
        }
        if prefetch_factor is not None:
            extra["prefetch_factor"] = prefetch_factor
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle and sampler is None,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        drop_last=drop_last,
        worker_init_fn=worker_init_fn,
        generator=torch.Generator().manual_seed(seed),
        **extra,
    )


def subset(dataset: Dataset, n: int | None) -> Dataset:
    """The first ``n`` samples (all when ``n`` is None or larger): quick mode's small run."""
    if n is None or n >= len(dataset):  # type: ignore[arg-type]
        return dataset
    return Subset(dataset, range(n))
