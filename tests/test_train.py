"""helpers.train: the timer measures what it says, and the loop learns and is reproducible."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import real_mnist_root

from helpers import train as tr
from helpers.data import SyntheticMNIST, default_transform, load_mnist, make_loader, subset
from helpers.models import SimpleCNN


class FakeClock:
    """time.perf_counter that advances 1 s per read, logging each read next to device syncs."""

    def __init__(self, events: list[str]):
        self.now, self.events = -1.0, events

    def __call__(self) -> float:
        self.events.append("clock")
        self.now += 1.0
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock([])
    monkeypatch.setattr(tr.time, "perf_counter", fake)
    return fake


def test_throughput_skips_warmup_and_counts_samples(clock: FakeClock) -> None:
    timer = tr.Throughput("cpu", warmup=2)
    assert math.isnan(timer.samples_per_s)
    for _ in range(5):
        timer.step(10)
    # Steps 1-2 are warm-up; the clock starts at the end of step 2 (t=0) and the three
    # measured steps end at t=1, 2, 3: 30 samples in 3 s.
    assert clock.events == ["clock"] * 4
    assert timer.samples == 30 and timer.seconds == 3.0 and timer.samples_per_s == 10.0
    assert timer.step_seconds == [1.0, 1.0, 1.0] and timer.median_step_s == 1.0


def test_throughput_counts_cpu_time_of_the_measured_steps_only(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = iter([100.0, 107.0, 110.0, 114.0])  # process_time: creation, end of warm-up, 2 steps
    monkeypatch.setattr(tr.time, "process_time", lambda: next(cpu))
    timer = tr.Throughput("cpu", warmup=1)
    assert math.isnan(timer.cpu_ms_per_sample)
    for _ in range(3):
        timer.step(10)
    assert timer.cpu_ms_per_sample == pytest.approx((114.0 - 107.0) * 1e3 / 20)


def test_throughput_without_warmup_starts_at_creation(clock: FakeClock) -> None:
    timer = tr.Throughput("cpu", warmup=0)
    timer.step(4)
    timer.step(6)
    assert timer.samples == 10 and timer.seconds == 2.0 and timer.samples_per_s == 5.0


def test_throughput_synchronises_before_reading_the_clock(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: clock.events.append("cuda sync"))
    monkeypatch.setattr(torch.mps, "synchronize", lambda *a: clock.events.append("mps sync"))
    timer = tr.Throughput("cuda:0", warmup=1)
    timer.step(1)
    timer.step(1)
    assert clock.events == ["cuda sync", "clock"] * 2
    clock.events.clear()
    tr.Throughput(torch.device("mps"), warmup=0)
    assert clock.events == ["mps sync", "clock"]
    clock.events.clear()
    tr.Throughput("cpu", warmup=0)
    assert clock.events == ["clock"]  # nothing to wait for on CPU


def _real_or_synthetic() -> tuple[object, object, str]:
    """The offline MNIST slice when it is here, else synthetic data (both must learn)."""
    root = real_mnist_root()
    if root is not None:
        (train, kind), (test, _) = load_mnist(root), load_mnist(root, train=False)
        return train, test, kind
    t = default_transform()
    return SyntheticMNIST(True, 2000, t), SyntheticMNIST(False, 500, t), "synthetic"


@pytest.fixture(scope="module")
def mnist() -> tuple[object, object, str]:
    return _real_or_synthetic()


def _run(train_set: object, test_set: object, seed: int) -> tuple[dict, float]:
    """20 Adam steps of 64 images; returns the history and the test loss before training."""
    tr.seed_everything(seed)
    model = SimpleCNN()
    loader = make_loader(subset(train_set, 1280), 64, seed=seed)
    test_loader = make_loader(subset(test_set, 500), 250, shuffle=False)
    before = tr.evaluate(model, test_loader, "cpu")["loss"]
    history = tr.fit(
        model,
        loader,
        test_loader,
        "cpu",
        epochs=1,
        lr=1e-3,
        optimizer="adam",
        seed=seed,
        progress=False,
    )
    return history, before


def test_fit_learns(mnist: tuple[object, object, str]) -> None:
    train_set, test_set, kind = mnist
    history, before = _run(train_set, test_set, seed=0)
    assert len(history["step_losses"]) == 20 and len(history["accuracy"]) == 1
    # Measured on the MNIST slice, seeds 0-2: test loss 2.31 -> 0.61-0.85, accuracy 0.70-0.81.
    assert history["test_loss"][0] < 0.5 * before, kind
    assert history["final_accuracy"] > 0.5, kind  # chance is 0.1
    assert history["samples_per_s"][0] > 0


def test_fit_is_reproducible(mnist: tuple[object, object, str]) -> None:
    train_set, test_set, _ = mnist
    small_train, small_test = subset(train_set, 320), subset(test_set, 100)
    (a, _), (b, _) = _run(small_train, small_test, seed=1), _run(small_train, small_test, seed=1)
    assert a["step_losses"] == b["step_losses"] and a["accuracy"] == b["accuracy"]
    c, _ = _run(small_train, small_test, seed=2)
    assert c["step_losses"] != a["step_losses"]


def test_train_epoch_and_evaluate_details() -> None:
    ds = SyntheticMNIST(size=100, transform=default_transform())
    model = SimpleCNN()
    opt = tr.make_optimizer(model, "adam", 1e-3)
    out = tr.train_epoch(model, make_loader(ds, 32), opt, "cpu", max_steps=2, progress=False)
    assert out["steps"] == 2 and len(out["losses"]) == 2 and 0 <= out["accuracy"] <= 1
    ev = tr.evaluate(model, make_loader(ds, 32, shuffle=False), "cpu")
    assert ev["samples"] == 100 and not model.training  # counts the short last batch
    with pytest.raises(ValueError, match="sgd"):
        tr.make_optimizer(model, "lbfgs", 0.1)


def test_seed_everything_repeats_draws() -> None:
    import random

    tr.seed_everything(7)
    first = (random.random(), torch.rand(3))
    tr.seed_everything(7)
    second = (random.random(), torch.rand(3))
    assert first[0] == second[0] and torch.equal(first[1], second[1])


def test_the_training_bar_stays_with_its_final_rate(capsys: pytest.CaptureFixture) -> None:
    """tqdm.auto's bar is left on screen when the loop ends (a vanished bar tells nothing)."""
    ds = SyntheticMNIST(size=96, transform=default_transform())
    model = SimpleCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tr.train_epoch(model, make_loader(ds, 16), opt, "cpu", desc="train")
    final = capsys.readouterr().err.split("\r")[-1]  # what the terminal keeps of the bar
    assert final.endswith("\n"), "leave=True: the bar's last state stays on its own line"
    assert "train: 100%" in final and "6/6" in final
    assert "batch/s" in final and "samples_per_s=" in final
