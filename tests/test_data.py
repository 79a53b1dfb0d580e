"""helpers.data: the fallback chain (files -> download -> synthetic), one download at a time
across ranks and nodes (mnist_once), and the DataLoader factory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import real_mnist_root
from torch.utils.data import SequentialSampler
from torchvision import datasets

from helpers import data

REAL_ROOT = real_mnist_root()
needs_real = pytest.mark.skipif(
    REAL_ROOT is None,
    reason="no MNIST files: set MULTIGPU_LAB_DATA "
    "to a folder with MNIST/raw (e.g. the shared offline slice)",
)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every download attempt fails as it does without network; the attempts are counted.

    The mirrors count as reachable, so the download itself is tried (and fails)."""
    calls: list[str] = []
    monkeypatch.setattr(data, "_mirror_reachable", lambda: True)

    def no_network(self: datasets.MNIST) -> None:
        calls.append(self.root)
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz: no network (test)")

    monkeypatch.setattr(datasets.MNIST, "download", no_network)
    return calls


def test_data_root_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(data.DATA_ENV, raising=False)
    assert data.data_root() == data.REPO_ROOT / "data"
    monkeypatch.setenv(data.DATA_ENV, str(tmp_path / "env"))
    assert data.data_root() == tmp_path / "env"
    assert data.data_root(tmp_path / "arg") == tmp_path / "arg"


@needs_real
def test_files_present_load_real_mnist_without_network(offline: list[str]) -> None:
    train, kind = data.load_mnist(REAL_ROOT, train=True)
    test, test_kind = data.load_mnist(REAL_ROOT, train=False)
    assert (kind, test_kind) == ("mnist", "mnist")
    assert (len(train), len(test)) == (8000, 2000)
    assert offline == []  # files on disk: the network is never tried
    x, y = train[0]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and 0 <= y <= 9
    assert abs(float(x.mean())) < 1.5  # normalised, not raw 0..1 pixels


def _write_idx(path: Path, tensor: torch.Tensor) -> None:
    """MNIST's idx format: zero, zero, the type (0x08: uint8), the rank; sizes; the bytes."""
    header = bytes([0, 0, 8, tensor.dim()]) + b"".join(n.to_bytes(4, "big") for n in tensor.shape)
    path.write_bytes(header + tensor.to(torch.uint8).numpy().tobytes())


def test_the_kits_reader_gives_torchvisions_samples_bit_for_bit(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, digits in (
        ("train", data.SyntheticMNIST(size=64)),
        ("t10k", data.SyntheticMNIST(train=False, size=32)),
    ):
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", digits.data)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", digits.targets)
    for train in (True, False):
        ours, kind = data.load_mnist(tmp_path, train=train, download=False)
        theirs = datasets.MNIST(tmp_path, train=train, transform=data.default_transform())
        assert kind == "mnist" and len(ours) == len(theirs)
        assert torch.equal(ours.data, theirs.data) and torch.equal(ours.targets, theirs.targets)
        for i in range(len(ours)):
            assert torch.equal(ours[i][0], theirs[i][0]) and ours[i][1] == theirs[i][1]
    with_transform, _ = data.load_mnist(tmp_path, transform=data.default_transform())
    plain, _ = data.load_mnist(tmp_path)  # no transform: the same tensors, without PIL
    assert torch.equal(with_transform[3][0], plain[3][0]) and plain[3][0].shape == (1, 28, 28)


def test_a_training_script_does_not_import_torchvision(no_orphans) -> None:
    """torchvision costs each torchrun worker seconds of start-up; the scripts do not need it."""
    modules = "helpers.data, helpers.models, helpers.launch, helpers.train, helpers.progress"
    code = f"import sys, {modules}; print([m for m in sys.modules if 'torchvision' in m])"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=data.REPO_ROOT, check=True
    )
    assert out.stdout.strip() == "[]"


def test_absent_and_offline_falls_back_to_synthetic(
    tmp_path: Path, offline: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.warns(data.SyntheticDataWarning, match="SYNTHETIC DATA"):
        train, kind = data.load_mnist(tmp_path, train=True)
    assert kind == "synthetic" and len(offline) == 1
    assert "SYNTHETIC DATA" in capsys.readouterr().out  # the banner, not only a warning
    with pytest.warns(data.SyntheticDataWarning):
        test, _ = data.load_mnist(tmp_path, train=False)
    assert "SYNTHETIC DATA" not in capsys.readouterr().out  # the banner once per process
    assert (len(train), len(test)) == (8000, 2000)
    x, y = train[0]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32
    labels = train.targets
    assert labels.min() == 0 and labels.max() == 9 and torch.bincount(labels).min() > 600


def test_the_banner_is_rank_0s_in_a_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a torchrun job every rank warns, rank 0 alone prints the banner for the job."""
    monkeypatch.setenv("RANK", "1")
    with pytest.warns(data.SyntheticDataWarning):
        data.load_mnist(tmp_path, download=False)
    assert "SYNTHETIC DATA" not in capsys.readouterr().out


def test_download_false_never_tries_network(tmp_path: Path, offline: list[str]) -> None:
    with pytest.warns(data.SyntheticDataWarning, match="download=False"):
        _, kind = data.load_mnist(tmp_path, download=False)
    assert kind == "synthetic" and offline == []


def test_download_true_insists_on_real_data(tmp_path: Path, offline: list[str]) -> None:
    with pytest.raises(RuntimeError, match="Could not download MNIST"):
        data.load_mnist(tmp_path, download=True)


def test_unreachable_mirrors_fall_back_without_downloading(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Offline with dropped packets: one short connection attempt per mirror, then synthetic."""
    tried: list[tuple[str, float]] = []
    downloads: list[str] = []

    def dropped(address: tuple[str, int], timeout: float) -> None:
        tried.append((address[0], timeout))
        raise TimeoutError("timed out")

    monkeypatch.setattr(datasets.MNIST, "download", lambda self: downloads.append(self.root))
    monkeypatch.setattr(data.socket, "create_connection", dropped)
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    with pytest.warns(data.SyntheticDataWarning, match="no MNIST mirror answered within 3 s"):
        _, kind = data.load_mnist(tmp_path)
    assert kind == "synthetic" and downloads == []
    assert len(tried) == len(datasets.MNIST.mirrors)
    assert all(timeout <= data.PROBE_TIMEOUT_S <= 5 for _, timeout in tried)


@needs_real
def test_a_truncated_file_is_named_in_the_error(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    shutil.copytree(REAL_ROOT / "MNIST" / "raw", raw)
    damaged = raw / "train-images-idx3-ubyte"
    damaged.chmod(0o644)
    damaged.write_bytes(damaged.read_bytes()[:100_000])  # a copy cut short
    with pytest.raises(
        data.CorruptDataError,
        match=r"train-images-idx3-ubyte is damaged: it "
        r"has 100,000 bytes where its header promises 6,272,016",
    ):
        data.load_mnist(tmp_path)
    (raw / "t10k-labels-idx1-ubyte").chmod(0o644)
    (raw / "t10k-labels-idx1-ubyte").write_bytes(b"<html>not found</html>")
    damaged.write_bytes((REAL_ROOT / "MNIST" / "raw" / damaged.name).read_bytes())
    with pytest.raises(data.CorruptDataError, match="t10k-labels.* MNIST labels header"):
        data.load_mnist(tmp_path, train=False)


def test_download_has_a_short_timeout_that_is_restored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[float | None] = []
    monkeypatch.setattr(data, "_mirror_reachable", lambda: True)

    def fake_download(self: datasets.MNIST) -> None:
        import socket

        seen.append(socket.getdefaulttimeout())
        raise RuntimeError("offline")

    monkeypatch.setattr(datasets.MNIST, "download", fake_download)
    import socket

    before = socket.getdefaulttimeout()
    with pytest.warns(data.SyntheticDataWarning):
        data.load_mnist(tmp_path)
    assert seen == [data.DOWNLOAD_TIMEOUT_S] and socket.getdefaulttimeout() == before


def test_synthetic_is_deterministic_and_learnable() -> None:
    a, b = data.SyntheticMNIST(size=500), data.SyntheticMNIST(size=500)
    assert torch.equal(a.data, b.data) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.data, data.SyntheticMNIST(train=False, size=500).data)
    # Class structure: nearest class mean on raw pixels is far above chance (0.1).
    x = a.data.float().flatten(1)
    means = torch.stack([x[a.targets == k].mean(0) for k in range(10)])
    assert (torch.cdist(x, means).argmin(1) == a.targets).float().mean() > 0.5


# ---------------------------------------------------------------- mnist_once, 2 processes


LAYOUTS = {  # how many ranks share a node, whether the nodes share a folder, who downloads
    "one node, 2 ranks": ((0, 1), True, ["0"]),
    "two nodes, one shared folder": ((0, 0), True, ["0"]),  # the Slurm template's case
    "two nodes, each its own disk": ((0, 0), False, ["0", "1"]),
}


def _node_worker(rank: int, base: str, source: str) -> None:
    """One rank of the test job, through every layout in turn (one process group each): the
    'download' copies the offline slice and logs when it ran."""
    for n, (local_ranks, shared, _) in enumerate(LAYOUTS.values()):
        folder = Path(base) / str(n)
        os.environ["LOCAL_RANK"] = str(local_ranks[rank])  # what torchrun would set on its node
        init = f"file://{folder / 'init'}"
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
        root = folder / ("data" if shared else f"node{rank}")

        def fake_download(_root: Path, folder: Path = folder) -> None:
            start = time.time()
            time.sleep(1.0)  # long enough for a second download into the same folder to overlap
            if not source:
                raise RuntimeError("offline (test)")
            shutil.copytree(Path(source) / "MNIST", Path(_root) / "MNIST")
            with open(folder / "downloads.txt", "a") as f:
                f.write(f"{rank} {_root} {start} {time.time()}\n")

        data._download = fake_download  # type: ignore[assignment]
        try:
            dataset, kind = data.mnist_once(str(root), train=True)
            (folder / f"rank{rank}.txt").write_text(f"{kind} {len(dataset)}")
        finally:
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def layouts_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three layouts in one 2-process job: each process starts once (seconds), not thrice."""
    base = tmp_path_factory.mktemp("mnist_once")
    for n in range(len(LAYOUTS)):
        (base / str(n)).mkdir()
        (base / str(n) / "downloads.txt").touch()
    mp.spawn(_node_worker, args=(str(base), str(REAL_ROOT or "")), nprocs=2, join=True)
    return base


@pytest.mark.job  # two spawned processes, once for the module
@pytest.mark.parametrize("layout", LAYOUTS)
def test_mnist_once_never_downloads_twice_into_one_folder(layout: str, layouts_run: Path) -> None:
    folder = layouts_run / str(list(LAYOUTS).index(layout))
    downloaders = LAYOUTS[layout][2]
    downloads = [line.split() for line in (folder / "downloads.txt").read_text().splitlines()]
    if REAL_ROOT:
        assert sorted(d[0] for d in downloads) == downloaders, layout
        for a in downloads:  # no two downloads into one folder at the same time
            for b in downloads:
                if a is not b and a[1] == b[1]:
                    assert float(a[3]) <= float(b[2]) or float(b[3]) <= float(a[2]), layout
    kinds = {p.read_text() for p in folder.glob("rank*.txt")}
    expected = "mnist 8000" if REAL_ROOT else "synthetic 8000"
    assert kinds == {expected}  # one kind, one length on every rank


def test_mnist_once_without_process_group_is_load_mnist(tmp_path: Path, offline: list[str]) -> None:
    assert not dist.is_initialized()
    with pytest.warns(data.SyntheticDataWarning):
        dataset, kind = data.mnist_once(tmp_path, train=False)
    assert kind == "synthetic" and len(dataset) == 2000


# ---------------------------------------------------------------- loaders


def _tiny() -> data.SyntheticMNIST:
    return data.SyntheticMNIST(size=64, transform=data.default_transform())


def test_make_loader_is_seeded() -> None:
    ds = _tiny()
    first = [y.tolist() for _, y in data.make_loader(ds, 16, seed=3)]
    again = [y.tolist() for _, y in data.make_loader(ds, 16, seed=3)]
    other = [y.tolist() for _, y in data.make_loader(ds, 16, seed=4)]
    assert first == again and first != other


def test_make_loader_options() -> None:
    ds = _tiny()
    with pytest.raises(ValueError, match="persistent_workers"):
        data.make_loader(ds, 8, persistent_workers=True)
    plain = data.make_loader(ds, 8, prefetch_factor=4)  # dropped: no workers to prefetch
    assert plain.prefetch_factor is None and plain.num_workers == 0
    by_sampler = data.make_loader(ds, 8, shuffle=True, sampler=SequentialSampler(ds))
    assert [int(y) for _, ys in by_sampler for y in ys] == ds.targets.tolist()
    workers = data.make_loader(ds, 8, num_workers=1, persistent_workers=True, prefetch_factor=3)
    assert workers.prefetch_factor == 3 and workers.persistent_workers
    assert sum(len(y) for _, y in workers) == 64


def test_subset_takes_the_first_n() -> None:
    ds = _tiny()
    small = data.subset(ds, 10)
    assert len(small) == 10 and small[3][1] == ds[3][1]
    assert data.subset(ds, 1000) is ds and data.subset(ds, None) is ds
