"""Shared fixtures: each notebook is executed headlessly once per test session, then reused.

Execution is a client's command line in a subprocess (papermill, nbval or nbconvert: the one
tests/clients.py names for the lesson), judged by its own exit code, as cron or Airflow would
run it. Notebooks in ``CLASSROOM`` are run by papermill as two students at once on this one
machine (``classroom``), one in English and one in the zh_CN edition; those two runs serve every
other test of both editions, so the classroom check costs no run of its own.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import clients
import pytest

from helpers import data, messages, record
from helpers.procs import descendants, is_alive
from labtools import i18n, runner

# The tests read the helpers' English messages, whatever this machine's locale: LANGUAGE wins
# over LANG in gettext. The zh_CN edition still answers in Chinese (its notebook says so). A
# test run started from a notebook's kernel does not inherit that notebook's language either.
os.environ.pop(messages.LANG_ENV, None)
os.environ.pop(messages.SESSION_ENV, None)
os.environ["LANGUAGE"] = "en"

NOTEBOOK_FIXTURES = {"notebook_run", "notebook_record", "classroom"}
# A test that starts processes checks that it leaves none running: that fixture marks it ``job``.
JOB_FIXTURES = {"no_orphans"}
UNIT_LANE_S = 2.0  # a test slower than this, marked neither, is named at the end of the run


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that executes a notebook ``notebook`` and every test that starts
    processes ``job`` (a torch process costs seconds to start), so ``-m "not notebook and not
    job"`` is the unit lane that runs in seconds (``make unit``); and keep all tests of one
    notebook in one xdist group: each worker process has its own session cache, so a notebook
    split across workers would execute twice. A lesson's other tests (its module's ``STEM``)
    join that group too: notebook 14's create network namespaces, which the classroom check of
    09 counts."""
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        if uses & NOTEBOOK_FIXTURES or item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.notebook)
        if uses & JOB_FIXTURES:
            item.add_marker(pytest.mark.job)
        if item.get_closest_marker("browser"):
            item.add_marker(pytest.mark.xdist_group("browser"))  # one JupyterLab server
        elif item.get_closest_marker("notebook") or hasattr(getattr(item, "module", None), "STEM"):
            item.add_marker(pytest.mark.xdist_group(notebook_of(item)))


# Seconds of each notebook execution the session paid for (the fixtures below), for the summary.
EXECUTIONS: dict[str, float] = {}
LANES = (
    "browser",
    "notebook",
    "slurm",
    "scale",
    "job",
)  # by marker, first match; the rest is the unit lane


def pytest_terminal_summary(terminalreporter) -> None:
    """Where the minutes went, then the unit-lane tests that took long."""
    minutes_by_lane(terminalreporter)
    slow_unit_tests(terminalreporter)


def minutes_by_lane(terminalreporter) -> None:
    """Each lane's seconds (setup, call and teardown of its tests, a notebook's execution
    included in the first test that asked for it), then every execution: what a new lesson or
    one more torchrun launch in a lesson costs `make test` (benchmarks/README.md)."""
    lanes: dict[str, list[float]] = {}
    for kind in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(kind, []):
            if not hasattr(report, "duration") or not hasattr(report, "keywords"):
                continue
            lane = next((m for m in LANES if m in report.keywords), "unit")
            lanes.setdefault(lane, []).append(report.duration)
    if not lanes:
        return
    floor = launch_floor_s() if set(lanes) - {"unit"} else None
    terminalreporter.write_sep("-", "where the minutes went")
    if floor:
        terminalreporter.write_line(
            f"  launch floor {floor:.1f} s (an empty 2-rank torchrun launch, measured now on "
            f"{cpu_name()}, {os.cpu_count()} cores): each lane in floors, to compare machines"
        )
    for lane, seconds in sorted(lanes.items(), key=lambda kv: -sum(kv[1])):
        in_floors = f"  {sum(seconds) / floor:6.0f} floors" if floor else ""
        terminalreporter.write_line(f"  {lane:9} {sum(seconds) / 60:5.1f} min{in_floors}")
    for name, seconds in sorted(EXECUTIONS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"    {seconds:6.1f} s  {name}")


def launch_cost_benchmark() -> Any:
    """benchmarks/launch_cost.py as a module (benchmarks/ is no package): its floor and fixtures."""
    import importlib.util

    from helpers.paths import REPO_ROOT

    spec = importlib.util.spec_from_file_location(
        "launch_cost", REPO_ROOT / "benchmarks" / "launch_cost.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def launch_cost() -> Any:
    return launch_cost_benchmark()


def launch_floor_s(repeats: int = 2) -> float | None:
    """The fastest of ``repeats`` empty 2-rank launches (benchmarks/launch_cost.py's), now, on
    this machine: the unit a lane's minutes are divided by, so a slow and a fast machine's
    summaries compare (issue 48). None where no launch could be made."""
    import tempfile

    cost = launch_cost_benchmark()
    try:
        with tempfile.TemporaryDirectory() as folder:
            script, _ = cost.write_fixtures(Path(folder))
            return min(
                cost.seconds_per_launch(script, [], 2, Path(folder) / f"empty{i}")
                for i in range(repeats)
            )
    except Exception:  # a report, never a failure of the run
        return None


def cpu_name() -> str:
    """The processor's model name (/proc/cpuinfo), as the floor's machine."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "this CPU"


def slow_unit_tests(terminalreporter) -> None:
    """Name the unit-lane tests that took long: they start processes (mark them ``job``, or
    give them ``no_orphans``) or execute a notebook (``notebook``). A report, not a failure:
    how long a test takes depends on the machine."""
    slow = [
        f"  {r.nodeid} ({r.duration:.1f} s)"
        for kind in ("passed", "failed")
        for r in terminalreporter.stats.get(kind, [])
        if r.when == "call"
        and r.duration > UNIT_LANE_S
        and not {"job", "notebook"} & set(r.keywords)
    ]
    if slow:
        terminalreporter.write_sep(
            "-", f"slower than {UNIT_LANE_S} s, marked neither job nor notebook"
        )
        terminalreporter.write_line("\n".join(slow))


def notebook_of(item: pytest.Item) -> str:
    """The notebook a test executes: its ``stem`` parameter, else its module's ``STEM``."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "stem" in params:
        return str(params["stem"])
    return str(getattr(item.module, "STEM", "00_environment"))  # the harness's own checks use 00


SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # beside the checkout


def real_mnist_root() -> Path | None:
    """Where the tests find real MNIST: $MULTIGPU_LAB_DATA when it holds the files, else the
    shared offline slice beside the checkout; None when neither does (tests then skip or use
    the synthetic stand-in)."""
    for candidate in (os.environ.get(data.DATA_ENV), SHARED_DATA):
        if candidate and data.mnist_present(candidate):
            return Path(candidate)
    return None


CLASSROOM = ("02_distributed_data_parallel", "14_multi_node")  # the two notebooks
# The classroom's students, by edition: one follows the English lesson, one the Chinese (a
# workshop of Chinese-speaking learners has both), so the second copy is also the zh_CN
# edition's run of that lesson.
STUDENT_EDITIONS: tuple[str | None, ...] = (None, "zh_CN")


@dataclass
class Classroom:
    """Copies of one notebook run at the same time, and what they wrote outside their folders."""

    outcomes: list[runner.Outcome]
    shared_files_written: list[str]  # files under notebooks/ created or changed meanwhile


def files_under(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_mtime_ns
        for p in folder.rglob("*")
        if p.is_file() and ".ipynb_checkpoints" not in p.parts
    }


def edition(factory: pytest.TempPathFactory, stem: str, lang: str | None) -> Path | None:
    """The translated notebook, built into a temporary ``<lang>/`` folder (never into
    notebooks/, which the classroom check watches); None for the English one."""
    if lang is None:
        return None
    return i18n.edition_path(lang, stem, factory.mktemp("ed") / lang)


@pytest.fixture(scope="session")
def classroom(tmp_path_factory: pytest.TempPathFactory):
    """Run a notebook as one copy per ``STUDENT_EDITIONS`` at the same time (once), as on a
    workshop server; ``outcomes`` follow that order."""
    cache: dict[str, Classroom] = {}

    def run(stem: str) -> Classroom:
        if stem not in cache:
            sources = [edition(tmp_path_factory, stem, lang) for lang in STUDENT_EDITIONS]
            folders = [tmp_path_factory.mktemp(f"{stem}-student{n}") for n in range(len(sources))]
            before, start = files_under(runner.NOTEBOOKS), time.perf_counter()
            with ThreadPoolExecutor(len(sources)) as pool:
                runs = list(
                    pool.map(
                        lambda out, src: runner.execute(stem, out, quick=True, source=src),
                        folders,
                        sources,
                    )
                )
            EXECUTIONS[f"{stem}, classroom of {len(sources)}"] = time.perf_counter() - start
            after = files_under(runner.NOTEBOOKS)
            written = sorted(name for name, mtime in after.items() if before.get(name) != mtime)
            cache[stem] = Classroom(runs, written)
        return cache[stem]

    return run


@pytest.fixture(scope="session")
def notebook_run(tmp_path_factory: pytest.TempPathFactory, classroom):
    """Execute a notebook in quick mode (once), with its client (tests/clients.py), and return
    its Outcome.

    ``lang`` (``zh_CN``) runs the translated edition (``edition``). A lesson of the
    classroom is not run again: its students' runs are its runs, one per edition.
    """
    cache: dict[tuple[str, str | None], runner.Outcome] = {}

    def run(stem: str, lang: str | None = None) -> runner.Outcome:
        if stem in CLASSROOM and lang in STUDENT_EDITIONS:
            return classroom(stem).outcomes[STUDENT_EDITIONS.index(lang)]
        if (stem, lang) not in cache:
            out = tmp_path_factory.mktemp(f"{lang}-{stem}" if lang else stem)
            start = time.perf_counter()
            if lang:
                source = edition(tmp_path_factory, stem, lang)
                cache[stem, lang] = runner.execute(stem, out, quick=True, source=source)
            else:
                cache[stem, lang] = clients.execute(stem, out)  # papermill, nbval or nbconvert
            client = f"{lang}, papermill" if lang else clients.client_of(stem)
            EXECUTIONS[f"{stem}, {client}"] = time.perf_counter() - start
        return cache[stem, lang]

    return run


@pytest.fixture(scope="session")
def notebook_record(notebook_run):
    """The metrics.json of a notebook that must have run cleanly."""

    def load(stem: str, lang: str | None = None) -> dict[str, Any]:
        outcome = notebook_run(stem, lang)
        assert outcome.status == "ok", f"{stem} failed headless:\n{outcome.error}"
        return record.load(Path(outcome.out_dir) / "metrics.json")

    return load


def live_children() -> list[int]:
    """Processes of this test session still running (zombies excluded)."""
    return [p for p in descendants(os.getpid()) if is_alive(p)]


@pytest.fixture
def no_orphans():
    """Fail the test if it leaves any child process running."""
    before = set(live_children())
    yield
    left = [p for p in live_children() if p not in before]
    assert not left, f"processes left running: {left}"
