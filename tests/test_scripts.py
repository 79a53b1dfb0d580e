"""Scripts are recovered from their lesson's %%writefile cell, byte for byte."""

from __future__ import annotations

import sys

import pytest

from helpers import scripts


def test_script_comes_from_the_notebook_cell(tmp_path):
    path = scripts.ensure_script("00_environment", "work/smoke_allreduce.py", cwd=tmp_path)
    text = path.read_text()
    assert text.startswith('"""All-reduce smoke test')
    assert "dist.all_reduce(x, op=dist.ReduceOp.SUM)" in text
    assert "%%writefile" not in text


def test_unknown_script_is_a_clear_error():
    with pytest.raises(LookupError, match="no '%%writefile work/nope.py' cell"):
        scripts.cell_script("00_environment", "work/nope.py")


def test_python_first_lines_with_quotes_do_not_stop_the_search():
    """06 has a code cell whose first line is a comment with an apostrophe (one core's rate)."""
    assert "def main()" in scripts.cell_script("06_dataloader_tuning", "work/loader_train.py")


def test_committed_copies_match_their_cells():
    """Jobs without a notebook run scripts/ddp_train.py: it must be the lesson's script."""
    assert scripts.stale_exports() == [], "run `make scripts` after editing the cell"
    text = (scripts.ROOT / "scripts" / "ddp_train.py").read_text()
    assert text.endswith(scripts.cell_script("02_distributed_data_parallel", "work/ddp_train.py"))


def test_the_scripts_a_lesson_writes_are_listed_once_each():
    assert scripts.written_scripts("07_profiling") == ["work/profile_ddp.py"]
    assert "work/ddp_train.py" in scripts.written_scripts("02_distributed_data_parallel")


def test_every_taught_script_passes_ruff(capsys):
    """ruff skips %%writefile cells and work/: `make lint` checks the scripts as files."""
    assert scripts.lint([sys.executable, "-m", "ruff"]) == 0, capsys.readouterr().out
