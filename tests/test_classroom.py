"""A workshop server: two students run the same notebook at the same time, on one machine,
one in English and one in the Chinese edition.

Ports, the scripts the cells write, checkpoints, records and network namespaces must not
collide: each copy runs in its own folder (helpers.params.use_run_folder), torchrun picks free
ports, and namespaces carry their owner's PID.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CLASSROOM

from helpers import cell_scripts, netns, record
from labtools import runner

TEACHER = "02_distributed_data_parallel"  # the notebook whose cells write ddp_train.py
SCRIPT = {"02_distributed_data_parallel": "work/ddp_train.py", "14_multi_node": "work/ddp_train.py"}


@pytest.mark.notebook
@pytest.mark.parametrize("stem", CLASSROOM)
def test_two_students_run_the_same_notebook_at_once(stem, classroom):
    room = classroom(stem)
    for n, outcome in enumerate(room.outcomes):
        assert outcome.status == "ok", f"student {n} of {stem} failed:\n{outcome.error}"
        rec = record.load(Path(outcome.out_dir) / "metrics.json")
        assert rec["params"]["quick"] is True and rec["metrics"]
        written = (Path(outcome.out_dir) / SCRIPT[stem]).read_text()
        assert written == cell_scripts.cell_script(TEACHER, SCRIPT[stem]), "script clobbered"
        assert runner.leftover_processes(outcome.out_dir) == []
    assert len({o.out_dir for o in room.outcomes}) == len(room.outcomes)
    assert room.shared_files_written == [], "the copies wrote into the shared notebooks/ folder"
    if stem == "14_multi_node" and netns.unavailable_reason() is None:
        left = [n for n in netns.list_namespaces() if n.startswith(netns.PREFIX)]
        assert left == [], f"network namespaces left behind: {left}"
