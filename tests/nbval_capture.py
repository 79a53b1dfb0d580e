"""A pytest plugin for nbval's run of a lesson: keeps what each code cell printed.

nbval executes a notebook cell by cell and compares, but writes no executed notebook. The
harness reads one (cell outputs, execution counts) whichever client ran the lesson, so this
plugin, loaded into the nbval run by tests/clients.py, writes ``<notebook>.executed.ipynb``
beside the notebook it ran: each code cell with the outputs nbval received for it
(``IPyNbCell.test_outputs``) and the order it ran in.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

ran: dict[Path, dict[int, list]] = {}  # notebook -> code cell number -> its outputs


@pytest.hookimpl(tryfirst=True)  # before the report is made: the hook stops at a result
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> None:
    outputs = getattr(item, "test_outputs", None)
    if call.when == "call" and outputs is not None:
        ran.setdefault(Path(str(item.parent.fspath)), {})[item.cell_num] = outputs


def pytest_sessionfinish(session: pytest.Session) -> None:
    for path, outputs in ran.items():
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        for number, cell in enumerate(code):
            cell.outputs, cell.execution_count = [], None
            if number in outputs:
                cell.outputs = [nbformat.from_dict(o) for o in outputs[number]]
                cell.execution_count = number + 1
                for out in cell.outputs:
                    if out.output_type == "execute_result":
                        out.execution_count = number + 1
        nbformat.write(nb, path.with_suffix(".executed.ipynb"))
