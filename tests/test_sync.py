"""One source, one refresh: every copy derived from the lessons is current, and an English
prose fix needs `make sync` alone (labtools.sync)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers.paths import REPO_ROOT
from labtools import i18n, reading, sync

LANG = "zh_CN"


def test_make_sync_leaves_no_diff():
    stale = sync.stale_copies()
    assert stale == [], f"derived copies differ from their sources: run `make sync` ({stale})"


@pytest.mark.parametrize(
    ("quick", "full", "english", "chinese"),
    [
        (15.87, None, "quick run 15 s", "快速运行约 15 秒"),
        (82.41, None, "quick run 80 s", "快速运行约 80 秒"),
        (2.0, 150.0, "quick run 5 s", "完整运行约 2.5 分钟"),
        (186.0, None, "quick run 3.1 min", "快速运行约 3.1 分钟"),
    ],
)
def test_the_header_says_the_measured_time(quick, full, english, chinese):
    on = "2 CPU cores, no GPU (make run QUICK=1, 2026-12-01, 9 min 55 s in all)"
    entry = {"measured": {"quick_s": quick, "full_s": full, "on": on}}
    line = sync.time_line(entry, "en")
    assert line.startswith("**Time:** ") and english in line and "2 CPU cores, no GPU" in line
    assert chinese in sync.time_line(entry, LANG) and "2 个 CPU 核心" in sync.time_line(entry, LANG)
    assert ("full run longer" in line) == (full is None)
    read = sync.time_line(entry, "en", reading_min=45)
    assert read.startswith("**Time:** reading about 45 min; quick run ")
    assert "阅读约 45 分钟；" in sync.time_line(entry, LANG, reading_min=45)
    assert sync.time_line({"measured": {}}, "en") is None  # nothing measured: nothing claimed


def test_a_line_is_replaced_where_it_stands_or_added():
    assert sync.with_line("# T\n**Time:** old\nmore", "**Time:**", "**Time:** new") == (
        "# T\n**Time:** new\nmore"
    )
    assert sync.with_line("# T\n", "**Time:**", "**Time:** new") == "# T\n**Time:** new"
    assert sync.with_line("# T", "**Time:**", None) == "# T"


# ---------------------------------------------------------------- end to end, on a copy


@pytest.fixture
def checkout(tmp_path):
    """A copy of the repository's sources, where make sync may write."""
    built = {REPO_ROOT / "notebooks" / lang for lang in i18n.editions()}  # make zh's output

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {"__pycache__", "work", ".ipynb_checkpoints"}
        return {n for n in names if n in skip or Path(folder, n) in built}

    for name in ("helpers", "labtools", "notebooks", "scripts", "tests/nbval"):
        shutil.copytree(REPO_ROOT / name, tmp_path / name, ignore=ignore)
    return tmp_path


def run_sync(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "LANGUAGE": "en"}
    return subprocess.run(
        [sys.executable, "-m", "labtools.sync", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def edit(path: Path, cell: int, old: str, new: str) -> str:
    raw = json.loads(path.read_text())
    source = "".join(raw["cells"][cell]["source"])
    assert old in source
    raw["cells"][cell]["source"] = source.replace(old, new, 1).splitlines(keepends=True)
    path.write_text(json.dumps(raw, indent=1, ensure_ascii=False) + "\n")
    return raw["cells"][cell]["id"]


def changed(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and (REPO_ROOT / p.relative_to(root)).read_bytes() != p.read_bytes()
    }


def test_a_prose_fix_is_green_after_make_sync_alone(checkout, no_orphans):
    """A typo fixed in an English paragraph: sync's check names the translation it leaves
    behind, make sync marks it, and the edition shows the English under a banner."""
    lesson = checkout / "notebooks/10_pipeline_parallel.ipynb"
    cell = next(
        i
        for i, c in enumerate(json.loads(lesson.read_text())["cells"])
        if c["cell_type"] == "markdown" and i > 2
    )
    source = "".join(json.loads(lesson.read_text())["cells"][cell]["source"])
    word = next(w for w in source.split() if w.isalpha() and len(w) > 4)
    cell_id = edit(lesson, cell, word, word + "s")  # the "typo fix"
    check = run_sync(checkout, "--check")
    assert check.returncode == 1 and "stale: notebooks/i18n/zh_CN/10_pipeline_parallel.json" in (
        check.stdout
    ), check.stdout + check.stderr
    done = run_sync(checkout)
    assert done.returncode == 0, done.stderr
    assert "10_pipeline_parallel: 1 stale" in done.stdout  # what waits for a translator
    assert changed(checkout) == {
        "notebooks/10_pipeline_parallel.ipynb",
        "notebooks/i18n/zh_CN/10_pipeline_parallel.json",
    }
    todo = json.loads((checkout / "notebooks/i18n/zh_CN/10_pipeline_parallel.json").read_text())
    assert todo["todo"] == {cell_id: "stale"}
    assert run_sync(checkout, "--check").returncode == 0


def test_a_new_measurement_rewrites_both_headers_and_keeps_the_translation(checkout, no_orphans):
    path = checkout / "notebooks/catalog.json"
    data = json.loads(path.read_text())
    data["notebooks"][0]["measured"]["quick_s"] = 42.0
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    done = run_sync(checkout)
    assert done.returncode == 0, done.stderr
    assert changed(checkout) >= {
        "notebooks/00_environment.ipynb",
        "notebooks/i18n/zh_CN/00_environment.json",
        "notebooks/README.md",
    }
    english = nbformat.read(checkout / "notebooks/00_environment.ipynb", as_version=4)
    assert "quick run 40 s on 2 CPU cores" in english.cells[0].source
    assert re.search(r"\*\*Time:\*\* reading about \d+ min;", english.cells[0].source)
    translation = json.loads((checkout / "notebooks/i18n/zh_CN/00_environment.json").read_text())
    entry = translation["cells"][english.cells[0].id]
    assert "快速运行约 40 秒" in "\n".join(entry["text"])
    assert entry["en_sha256"] == i18n.english_hash(english.cells[0].source)  # still current
    assert "todo" not in translation


def test_the_reading_estimate_counts_prose_and_code():
    """200 words and 20 lines of code a minute, in 5-minute steps, never under 5."""
    assert reading.reading_minutes({"words": 2000, "code_lines": 600}) == 40  # 10 + 30
    assert reading.reading_minutes({"words": 100, "code_lines": 10}) == 5
    assert reading.reading_minutes({"words": 2460, "code_lines": 903}) == 55
