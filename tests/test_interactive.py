"""Issue 20 headless: each explorer prints its summary, computed by the lesson's functions, and
each torchrun job prints one summary line per rank instead of every progress line.

The notebooks run once per session (conftest.notebook_run); these tests read what their cells
printed in the executed notebook. Each test names its notebook as its ``stem`` parameter, so
conftest groups it with the other tests of that notebook (one execution per xdist worker).
tests/test_browser.py checks the same widgets in JupyterLab.
"""

from __future__ import annotations

import re

import nbformat
import pytest

from helpers import record


def printed(notebook_run, stem: str, marker: str) -> list[str]:
    """The text printed by every code cell of ``stem`` whose source contains ``marker``."""
    outcome = notebook_run(stem)
    assert outcome.status == "ok", outcome.error
    nb = nbformat.read(outcome.output, as_version=4)
    return [
        "".join(o.get("text", "") for o in c.outputs if o.output_type == "stream")
        for c in nb.cells
        if c.cell_type == "code" and marker in c.source
    ]


def explorer_line(notebook_run, stem: str) -> str:
    (text,) = printed(notebook_run, stem, "explore(")
    return text.strip()


def numbers(pattern: str, text: str) -> list[float]:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in {text!r}"
    return [float(g) for g in match.groups()]


@pytest.mark.parametrize("stem", ["02_distributed_data_parallel"])
def test_ddp_jobs_print_a_summary_per_rank_not_every_progress_line(notebook_run, stem):
    m = record.load(notebook_run(stem).out_dir)["metrics"]
    jobs = printed(notebook_run, stem, "launch.torchrun(")
    # the core, exercise 02.1, DDP and one process (one cell), global batch and learning rate,
    # crash and restart, accumulation
    assert len(jobs) == 6
    for text in jobs:
        assert "progress:" not in text, "progress lines feed the bars, not the printed log"
        assert "last progress per rank:" in text
    ranks = re.findall(r"rank (\d+): (\d+)/(\d+) steps", jobs[0])
    assert sorted(int(r) for r, _, _ in ranks) == list(range(m["world_size"]))
    assert all(done == total for _, done, total in ranks), "each rank reached its last step"


@pytest.mark.parametrize("stem", ["10_pipeline_parallel"])
def test_pipeline_explorer_simulates_the_formula(notebook_run, stem):
    line = explorer_line(notebook_run, stem)
    s, m = numbers(r"S = (\d+), M = (\d+)", line)
    gpipe, one_f, formula = numbers(r"GPipe ([\d.]+)%, 1F1B ([\d.]+)%, formula \S+ ([\d.]+)%", line)
    assert gpipe == one_f == formula == round(100 * (s - 1) / (m + s - 1), 1)
    held_gpipe, held_1f1b = numbers(r"holds GPipe (\d+), 1F1B (\d+) micro", line)
    assert (held_gpipe, held_1f1b) == (m, min(s, m)), "1F1B frees activations sooner"


@pytest.mark.parametrize("stem", ["08_fully_sharded_data_parallel"])
def test_memory_calculator_puts_fsdp_far_below_ddp(notebook_run, stem):
    line = explorer_line(notebook_run, stem)
    params, ranks = numbers(r"([\d.]+) B parameters; per rank over (\d+) ranks", line)
    ddp, fsdp = numbers(r"DDP ([\d.]+) GB, FSDP ([\d.]+) GB", line)
    assert abs(ddp - 16 * params) <= 0.1 + 0.01 * ddp, "fp32 + AdamW: 16 bytes a parameter"
    assert abs(fsdp - ddp / ranks) <= 0.1 + 0.01 * fsdp, "FSDP shards everything, ~1/n"


@pytest.mark.parametrize("stem", ["03_mixed_precision"])
def test_amp_explorer_reports_the_measured_run(notebook_run, stem):
    m = record.load(notebook_run(stem).out_dir)["metrics"]
    line = explorer_line(notebook_run, stem)
    mode = line.split(":")[0]
    (accuracy,) = numbers(r"test accuracy ([\d.]+)", line)
    assert accuracy == round(m["accuracy"][mode], 4)
    (final,) = numbers(r"final loss ([\d.]+)", line)
    assert final == round(m["final_loss"][mode], 3)


@pytest.mark.parametrize("stem", ["04_dataloader_tuning"])
def test_loader_explorer_measures_a_short_run_of_the_tuned_setting(notebook_run, stem):
    best = record.load(notebook_run(stem).out_dir)["metrics"]["best_config"]
    line = explorer_line(notebook_run, stem)
    assert line.startswith(f"w{best.get('num_workers', 0)}")
    rate, epochs = numbers(r"([\d.]+) samples/s over (\d+) epochs", line)
    assert rate > 0 and epochs == 2
    first, second = numbers(r"epoch 1 ([\d.]+) s, epoch 2 ([\d.]+) s", line)
    assert first > 0 and second > 0
