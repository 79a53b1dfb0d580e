"""The parameters a notebook accepts, checked before any work starts, and the folders a run owns.

papermill injects ``-p name value`` pairs as a cell of assignments after the cell tagged
``parameters``. It converts ``True``/``False``/numbers and leaves everything else a string, and
it only *warns* about a name the notebook does not declare, so ``-p quick yes`` or a typo such
as ``-p epoch 3`` used to surface minutes later as a traceback deep inside a helper, or not at
all. ``check`` runs in the first lines after the parameters and stops the notebook with one
sentence that names the parameter, what it got, what it takes, and how to pass it.

``use_run_folder`` gives each run its own folder for the record, the figures and the scripts
its cells write, so two students running the same notebook on one server never share a file.
"""

from __future__ import annotations

import ast
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.messages import keep_edition
from helpers.paths import REPO_ROOT

INJECTED_HEADER = "# Parameters"  # papermill's first line of the cell it injects


class ParameterError(ValueError):
    """A notebook parameter that cannot work; the message says which, and how to fix it."""


@dataclass(frozen=True)
class Kind:
    """What one parameter accepts: a test on the value, and the words for the error message."""

    accepts: Callable[[Any], bool]
    words: str  # completes "must be ...", e.g. "a whole number >= 1"
    example: str  # a value that works, for the hint


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


FLAG = Kind(lambda v: isinstance(v, bool), "True or False", "True")
POSITIVE_INT = Kind(lambda v: _whole(v) and v >= 1, "a whole number >= 1", "2")
COUNT = Kind(lambda v: _whole(v) and v >= 0, "a whole number >= 0", "0")
POSITIVE = Kind(lambda v: _number(v) and v > 0, "a number > 0", "0.05")
NONNEGATIVE = Kind(lambda v: _number(v) and v >= 0, "a number >= 0", "0")


def one_of(*choices: Any) -> Kind:
    """A parameter with a fixed set of values (a model name, a mode)."""
    return Kind(lambda v: v in choices, f"one of {', '.join(map(repr, choices))}", repr(choices[0]))


def _nproc_ok(value: Any) -> bool:
    return value is None or (_whole(value) and value >= 1)


NPROC = Kind(_nproc_ok, "None (one per GPU, else 2 on CPU) or a whole number >= 1", "2")
COMMON = {
    "out_dir": Kind(lambda v: isinstance(v, (str, Path)), "a folder path", "'runs/x'"),
    "quick": FLAG,
}


def injected_names(history: list[str]) -> list[str]:
    """Names papermill injected in this kernel: the assignments of its ``# Parameters`` cells.

    The kernel keeps the source of every executed cell (IPython's ``In``); the injected cell is
    the only one that starts with papermill's header, so the notebook can tell a typo from a
    parameter without being told which notebook file it is.
    """
    names: list[str] = []
    for source in history:
        if not source.lstrip().startswith(INJECTED_HEADER):
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        names += [
            t.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        ]
    return names


def check(namespace: Mapping[str, Any], **kinds: Kind) -> None:
    """Stop with one clear sentence when a parameter cannot work.

    ``namespace`` is the notebook's ``globals()``; ``kinds`` names every parameter of the
    notebook besides ``out_dir`` and ``quick`` (always checked) with the kind it accepts.
    Also refused: a name papermill injected that the notebook does not declare, and an
    ``out_dir`` that cannot be written.
    """
    kinds = {**COMMON, **kinds}
    accepted = ", ".join(sorted(kinds))
    unknown = sorted(set(injected_names(list(namespace.get("In", [])))) - set(kinds))
    if unknown:
        raise ParameterError(
            f"unknown parameter(s) {', '.join(unknown)}: this notebook accepts {accepted}. "
            f"Check the spelling of the -p name (papermill only warns about it)."
        )
    for name, kind in kinds.items():
        if name not in namespace:
            raise ParameterError(f"parameter {name} is not defined: run the parameters cell first")
        value = namespace[name]
        if not kind.accepts(value):
            got = f"{value!r} ({type(value).__name__})"
            raise ParameterError(
                f"parameter {name} must be {kind.words}, got {got}. "
                f"With papermill: -p {name} {kind.example.strip(repr(''))}; in the notebook: "
                f"{name} = {kind.example}"
            )
    if "nproc" in kinds and namespace["nproc"] is not None:
        check_nproc(namespace["nproc"])
    writable(namespace["out_dir"])


def check_nproc(nproc: int) -> None:
    """More worker processes than GPUs (or than useful CPU processes) is refused up front."""
    from helpers.env import device_plan
    from helpers.launch import LaunchError
    from helpers.launch import check_nproc as launcher_check

    try:
        launcher_check(nproc, device_plan()["device"])
    except LaunchError as exc:
        raise ParameterError(f"parameter nproc: {exc}") from None


def writable(out_dir: str | Path) -> Path:
    """The folder, created if needed; refused with the reason when nothing can be written there."""
    path = Path(out_dir).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ParameterError(
            f"parameter out_dir {str(out_dir)!r} cannot be written ({exc.strerror or exc}). "
            f"Pass a folder you can write to, e.g. -p out_dir runs/mine"
        ) from None
    return path.resolve()


def use_run_folder(notebook: str, out_dir: str | Path) -> Path:
    """Make this run's folder the working directory, and return it.

    An empty ``out_dir`` (the default) becomes ``runs/manual/<notebook>/<time>-<pid>``: unique
    per kernel. Everything the lesson writes by a relative path (``%%writefile work/...``,
    checkpoints, traces) then lands in the run's own folder, next to its record: two students
    running this notebook on one server, or one student's two copies, never share a file.
    """
    if not str(out_dir).strip():
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        out_dir = REPO_ROOT / "runs" / "manual" / notebook / stamp
    folder = writable(out_dir)
    (folder / "work").mkdir(exist_ok=True)
    keep_edition()  # a notebook of notebooks/zh_CN/ still answers in Chinese from its run folder
    os.chdir(folder)
    print(f"This run's folder (record, figures, scripts in work/): {folder}")
    return folder
