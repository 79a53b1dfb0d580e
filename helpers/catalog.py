"""The lessons' catalog (notebooks/catalog.json) and the start page written from it.

One machine-readable file holds the order, what each lesson teaches, the hardware it adapts
to and its time budget; the runner takes its timeouts from it, and ``notebooks/README.md`` is
rendered from it (a test keeps the two identical), so nothing is written down twice.

    python -m helpers.catalog        # rewrite notebooks/README.md from catalog.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

from helpers.paths import NOTEBOOKS

START_PAGE = NOTEBOOKS / "README.md"


def catalog() -> list[dict[str, Any]]:
    """The lessons in order, with their time budgets."""
    return json.loads((NOTEBOOKS / "catalog.json").read_text())["notebooks"]


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
        "<!-- Written by `python -m helpers.catalog` from catalog.json; edit that file. -->",
        "",
        "Open the notebooks in this order. Each runs top to bottom on the hardware in front of",
        "you (NVIDIA GPUs with NCCL, otherwise CPU with gloo and 2 processes), ends with",
        "exercises and their checks (00–06), and leaves `metrics.json` in its `out_dir`.",
        "Set `quick = True` in a notebook's first code cell for the smallest run.",
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
    from helpers import i18n

    lines = [
        "",
        "## 中文版",
        "",
        "同一套课程的简体中文版：`make zh`（`make lab` 也会执行）根据上面的英文笔记本和",
        "`i18n/zh_CN/` 中的译文生成 `zh_CN/` 目录，代码与英文版完全相同，练习的检查结果和",
        "环境诊断的提示也以中文显示。`make lab LANG=zh_CN` 以中文界面打开 JupyterLab，",
        "`make run LANG=zh_CN` 无界面运行全部中文笔记本。",
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


def main() -> int:
    START_PAGE.write_text(start_page())
    print(f"Wrote {START_PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
