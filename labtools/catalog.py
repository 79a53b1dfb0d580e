"""The lessons' catalog (notebooks/catalog.json) and the start page written from it.

One machine-readable file holds the order, what each lesson teaches, the hardware it adapts
to and its time budget; the runner takes its timeouts from it, and ``make sync`` writes the
start page ``notebooks/README.md`` and each lesson's header time line from it, so nothing is
written down twice.

    python -m labtools.catalog runs/<time>   # each lesson's time in that run, then make sync
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import date
from pathlib import Path
from typing import Any

from helpers.paths import NOTEBOOKS

CATALOG = NOTEBOOKS / "catalog.json"
START_PAGE = NOTEBOOKS / "README.md"


def catalog() -> list[dict[str, Any]]:
    """The lessons in order, with their time budgets."""
    return json.loads(CATALOG.read_text())["notebooks"]


def record_times(key: str, quick_s: dict[str, float | None], on: str, path: Path = CATALOG) -> None:
    """Write each lesson's quick-mode seconds from one run under ``key`` (``measured`` on CPU,
    ``measured_gpu``), with the machine it ran on: the start page shows them, so they come from
    a run, never from an estimate. Lessons the run left out keep theirs.
    """
    data = json.loads(path.read_text())
    for entry in data["notebooks"]:
        if entry["stem"] in quick_s:
            entry[key] = {"quick_s": quick_s[entry["stem"]], "full_s": None, "on": on}
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def measured_on_cpu(run_dir: Path) -> tuple[dict[str, float | None], str]:
    """The quick-mode seconds of a ``make run QUICK=1`` folder and where they were measured; a
    run that was not in quick mode, not on CPU or not passed entirely is refused (its times are
    not the quick budget of every lesson) with a ValueError saying why."""
    from labtools import run_folder  # the run folder's reader, only for this command

    run = run_folder.load_run(run_dir)
    if not run.summary.get("quick"):
        raise ValueError(f"{run_dir}: not a quick-mode run (make run QUICK=1)")
    failed = [name for name, nb in run.notebooks.items() if not nb.passed]
    if failed:
        raise ValueError(f"{run_dir}: {', '.join(failed)} did not pass; measure a clean run")
    hardware = run.hardware() or {}
    if hardware.get("device") != "cpu":
        raise ValueError(f"{run_dir}: ran on {hardware.get('device')}; gpucheck records GPU times")
    seconds = {name: nb.seconds for name, nb in run.notebooks.items()}
    total = sum(s for s in seconds.values() if s)
    day = date.fromtimestamp((run.path / "summary.json").stat().st_mtime).isoformat()
    on = (
        f"{os.cpu_count()} CPU cores, no GPU (make run QUICK=1, {day}, "
        f"{total // 60:.0f} min {total % 60:.0f} s in all)"
    )
    return seconds, on


def catalog_entry(stem: str) -> dict[str, Any]:
    for entry in catalog():
        if entry["stem"] == stem:
            return entry
    raise KeyError(f"{stem} is not in notebooks/catalog.json; add it there (order, timeouts).")


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "not measured yet"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def start_page() -> str:
    """notebooks/README.md: the order, what each lesson teaches, hardware and measured time."""
    lines = [
        "# Multi-GPU Lab: start here",
        "",
        "<!-- Written by `make sync` from catalog.json; edit that file. -->",
        "",
        "Open the notebooks in this order. Each runs top to bottom on the hardware in front of",
        "you (NVIDIA GPUs with NCCL, otherwise CPU with gloo and 2 processes), holds its",
        "exercises in the sections that teach them (you predict, then run a job, and the check",
        "compares your prediction with the job's output), and leaves `metrics.json` in its",
        "`out_dir`.",
        "Set `quick = True` in a notebook's first code cell for the smallest run.",
        "",
        "**Your copy, exercises open.** `make lab` opens `lab/`, your copy of the lessons: each",
        "exercise's solution cell is a stub for you to fill in, and the check cell under it",
        "answers ❌ not yet, with a hint, until your answer is right. Each `make lab` refreshes",
        "the lessons you have not changed, so a `git pull` reaches you; one you changed (edited,",
        "or run and saved) is kept, and named: delete it, or `make lab-reset`, for the new one.",
        "`notebooks/` is the answer key, solutions filled in, the copy CI runs; instructors",
        "open it with `make lab SOLUTIONS=1`.",
        "",
        "| # | notebook | what it teaches | hardware | quick | full |",
        "|---|---|---|---|---|---|",
    ]
    for e in catalog():
        number, _, _ = e["stem"].partition("_")
        measured = e.get("measured", {})
        lines.append(
            f"| {number} | [{e['title']}]({e['stem']}.ipynb) | {e['teaches']} | {e['hardware']} "
            f"| {_minutes(measured.get('quick_s'))} | {_minutes(measured.get('full_s'))} |"
        )
    note = next((e["measured"]["on"] for e in catalog() if "measured" in e), None)
    if note:
        lines += ["", f"Times measured on {note}; `make run` prints them for your machine."]
    return "\n".join(lines + _chinese_section()) + "\n"


def _chinese_section() -> list[str]:
    """The start page's 中文版 section: the same lessons, titled from their translations."""
    from labtools import i18n

    lines = [
        "",
        "## 中文版",
        "",
        "同一套课程的简体中文版：`make zh`（`make lab SOLUTIONS=1` 也会执行）根据上面的",
        "英文笔记本和 `i18n/zh_CN/` 中的译文生成 `zh_CN/` 目录，代码与英文版完全相同，",
        "练习的检查结果和环境诊断的提示也以中文显示。`make lab LANG=zh_CN` 以中文界面打开",
        "JupyterLab，`make run LANG=zh_CN` 无界面运行全部中文笔记本。",
        "",
        "**你的练习副本。** `make lab LANG=zh_CN` 打开 `lab/zh_CN/`：每个练习的答案单元格换成了",
        "等你填写的占位代码，下面的检查单元格在答对之前显示 ❌ 还不对，并给出提示。每次",
        "`make lab` 都会刷新你没有改过的课程，`git pull` 的更新由此到达你的副本；改过（编辑过，",
        "或运行后保存过）的笔记本会保留，并打印其文件名：删除它或运行 `make lab-reset` 即可取得",
        "新版本。`notebooks/`（以及 `zh_CN/`）是答案，填好了解答，CI 运行的就是它；讲师用",
        "`make lab SOLUTIONS=1` 打开。",
        "",
        "| # | 笔记本 | 快速模式 | 完整模式 |",
        "|---|---|---|---|",
    ]
    for e in catalog():
        title = i18n.translated_notebook("zh_CN", e["stem"]).cells[0].source.splitlines()[0]
        number, _, name = title.removeprefix("# ").partition(" · ")
        times = [_minutes(e.get("measured", {}).get(k)) for k in ("quick_s", "full_s")]
        times = [t.replace("not measured yet", "尚未测量") for t in times]
        lines.append(f"| {number} | [{name}](zh_CN/{e['stem']}.ipynb) | {' | '.join(times)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labtools.catalog", description=__doc__)
    parser.add_argument("measured", type=Path, help="a make run QUICK=1 folder on CPU")
    args = parser.parse_args(argv)
    try:
        seconds, on = measured_on_cpu(args.measured)
    except ValueError as exc:
        parser.error(str(exc))
    record_times("measured", seconds, on)
    print(f"Wrote the measured quick-mode times of {len(seconds)} lessons: {on}")
    print("Now `make sync` writes them into the start page and the lessons' headers.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
