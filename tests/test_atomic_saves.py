"""Checkpoints the lessons teach are written atomically: a crash mid-write never leaves half a
file under the real name (notebook 02's DDP checkpoint, notebook 08's FSDP full state dict).

The function under test is the one the notebook cell writes, taken from the cell's script and
run here on its own, with a ``torch.save`` that dies half-way through writing.
"""

from __future__ import annotations

import ast
import os
import types
from pathlib import Path

import pytest
import torch

from helpers import cell_scripts

TAUGHT = [
    ("02_distributed_data_parallel", "work/ddp_train.py"),
    ("08_fully_sharded_data_parallel", "work/shard_equal.py"),
]


def taught_function(notebook: str, script: str, name: str, torch_module: object):
    """The function ``name`` as the notebook's script defines it, with ``torch`` stubbable."""
    tree = ast.parse(cell_scripts.cell_script(notebook, script))
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert found, f"{script} of {notebook} defines no function {name}()"
    namespace = {"torch": torch_module, "os": os, "Path": Path}
    exec(compile(ast.Module(body=found, type_ignores=[]), script, "exec"), namespace)
    return namespace[name]


def crashing_save(obj: object, path: str | Path) -> None:
    """torch.save that is killed after writing part of the file."""
    Path(path).write_bytes(b"PK\x03\x04 half a checkpoint")
    raise KeyboardInterrupt("killed while writing")


@pytest.mark.parametrize("notebook, script", TAUGHT)
def test_save_writes_the_whole_file(notebook: str, script: str, tmp_path: Path) -> None:
    save = taught_function(notebook, script, "save_atomic", torch)
    target = tmp_path / "checkpoint.pt"
    save({"w": torch.arange(4.0)}, target)
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.arange(4.0))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temporary left


@pytest.mark.parametrize("notebook, script", TAUGHT)
def test_a_crash_mid_write_keeps_the_previous_checkpoint(
    notebook: str, script: str, tmp_path: Path
) -> None:
    target = tmp_path / "checkpoint.pt"
    torch.save({"step": 20}, target)
    save = taught_function(
        notebook, script, "save_atomic", types.SimpleNamespace(save=crashing_save)
    )
    with pytest.raises(KeyboardInterrupt):
        save({"step": 30}, target)
    assert torch.load(target, weights_only=True) == {"step": 20}  # the old one, whole
