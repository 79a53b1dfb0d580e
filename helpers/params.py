"""The parameters a notebook accepts, checked before any work starts, and the folders a run owns.

papermill injects ``-p name value`` pairs as a cell of assignments after the cell tagged
``parameters``. It converts ``True``/``False``/numbers and leaves everything else a string, and
it only *warns* about a name the notebook does not declare, so ``-p quick yes`` or a typo such
as ``-p epoch 3`` used to surface minutes later as a traceback deep inside a helper, or not at
all. ``check`` runs in the first lines after the parameters and stops the notebook with one
sentence that names the parameter, what it got, what it takes, and how to pass it.

``apply_quick`` gives quick mode its smaller values, except for a parameter the run asked for by
name, and ``adjusted`` is how a notebook changes a value it was given (a crash step after the
end of a shortened run, a batch the ranks cannot split): both print what was used instead of
what was asked, and why, so a parameter always does what its comment says or says why not.

``use_run_folder`` gives each run its own folder for the record, the figures and the scripts
its cells write, so two students running the same notebook on one server never share a file.
"""

from __future__ import annotations

import ast
import math
import os
import re
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.messages import _, keep_edition
from helpers.paths import REPO_ROOT
from helpers.procs import LockHeld, PidLock

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


def at_least(low: int, example: str | None = None) -> Kind:
    """A whole number of at least ``low`` (a run needs 3 steps to show a skipped step, say)."""
    return Kind(lambda v: _whole(v) and v >= low, f"a whole number >= {low}", example or str(low))


FLAG = Kind(lambda v: isinstance(v, bool), "True or False", "True")
POSITIVE_INT = at_least(1, "2")
COUNT = at_least(0)
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


QUICK = re.compile(r"\(quick: ([^)]+)\)")  # "(quick: 1)" in a parameter's comment
AT_LEAST = re.compile(r"\bat least (\d+)\b")  # "at least 2"
CHOICE = re.compile(r'"([^"]+)"')  # a string parameter's choices, quoted in its comment
# Upper bounds, from the machine where they can be (issue 47): "at most 500"; a size in memory
# ("in MiB") or a count with a cost per unit ("~64 KiB each") or per unit squared ("~64 bytes
# per token squared": attention's scores), at most the memory available now, or "at most 1/16
# of memory"; a size on disk ("in GiB", "at most 1/4 of disk"); "at most the cores".
AT_MOST = re.compile(r"\bat most (\d+)\b(?! ?/)")
UNIT = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
IN_UNIT = re.compile(r"\bin (bytes|KiB|MiB|GiB)\b")
EACH = re.compile(r"~(\d+) ?(bytes|KiB|MiB|GiB) each\b")
SQUARED = re.compile(r"~(\d+) ?(bytes|KiB|MiB|GiB) per (\w+) squared\b")
SHARE = re.compile(r"\bat most 1/(\d+) of (memory|disk)\b")
CORES = re.compile(r"\bat most the cores\b")


def available_memory() -> int:
    """Bytes of memory this machine can give a run now without swapping (psutil)."""
    import psutil

    return int(psutil.virtual_memory().available)


def free_disk() -> int:
    """Bytes free on the disk of the working folder (where a run writes)."""
    import shutil

    return shutil.disk_usage(Path.cwd()).free


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def upper_bound(comment: str) -> tuple[int, str] | None:
    """The largest value a parameter's comment allows on this machine, and why, or None.

    ``why`` completes "at most N ...": empty for a literal bound, else what the bound is made of
    (the memory available now, a share of it, the disk's free space, the cores).
    """
    literal, share = AT_MOST.search(comment), SHARE.search(comment)
    unit, each = IN_UNIT.search(comment), EACH.search(comment)
    squared = SQUARED.search(comment)
    if CORES.search(comment):
        return cores(), " (the cores this machine has)"
    if not (unit or each or squared or share):
        return (int(literal[1]), "") if literal else None
    on_disk = share is not None and share[2] == "disk"
    room = free_disk() if on_disk else available_memory()
    parts = int(share[1]) if share else 1
    where = "the disk's free space" if on_disk else "the memory this machine has available now"
    if share:
        where = f"1/{parts} of {where}"
    if squared:  # cost x value^2 <= room
        cost = int(squared[1]) * UNIT[squared[2]]
        bound = math.isqrt(room // parts // cost)
        why = f" (at ~{squared[1]} {squared[2]} per {squared[3]} squared: {where})"
    elif each:
        cost = int(each[1]) * UNIT[each[2]]
        bound, why = room // parts // cost, f" (at ~{each[1]} {each[2]} each: {where})"
    else:
        name = unit[1] if unit else "bytes"
        bound, why = room // parts // UNIT[name], f" ({name}: {where})"
    if literal and int(literal[1]) <= bound:  # the comment's own number is the tighter bound
        return int(literal[1]), ""
    return bound, why


def at_most(kind: Kind, high: int, why: str, example: Any) -> Kind:
    """``kind``, up to ``high`` (a bound from the machine: ``why`` says which)."""
    example = example if kind.accepts(example) and example <= high else high
    return Kind(
        lambda v: kind.accepts(v) and v <= high,
        f"{kind.words} and at most {high}{why}",
        str(example),
    )


@dataclass(frozen=True)
class Declared:
    """One line of the parameters cell: ``name = default  # meaning, kind words, (quick: v)``."""

    name: str
    default: Any
    comment: str
    kind: Kind
    quick: Any = None  # None: the same in quick mode


def kind_of(name: str, default: Any, comment: str) -> Kind:
    """What a parameter accepts, read from its default and the words of its comment.

    True/False: a flag. A whole number: ``at least N`` when the comment says so, else at
    least 1 (0 when the default is 0, which the comment explains). A number with a point: > 0,
    or >= 0 when the default is 0. Either is bounded above as its comment says (``AT_MOST``:
    ``at most 500``, ``in MiB``, ``~64 KiB each``, ``~64 bytes per token squared``, ``at most
    1/16 of memory``, ``at most the cores``), by the machine's memory, disk or cores as they
    are when the run starts. A string: one of the quoted choices in the comment, any string
    when there are none. ``None``: a count of processes (one per GPU when None).
    """
    if name in COMMON:
        return COMMON[name]
    if isinstance(default, bool):
        return FLAG
    if isinstance(default, (int, float)):
        kind = _lower_bounded(default, comment)
        high = upper_bound(comment)
        return at_most(kind, *high, default) if high else kind
    if isinstance(default, str):
        choices = CHOICE.findall(comment)
        if default in choices:
            return one_of(*dict.fromkeys(choices))
        return Kind(lambda v: isinstance(v, str), "a string", repr(default))
    if default is None:
        return NPROC
    raise ParameterError(f"parameter {name} = {default!r}: no kind for a {type(default).__name__}")


def _lower_bounded(default: int | float, comment: str) -> Kind:
    if isinstance(default, float):
        return POSITIVE if default > 0 else NONNEGATIVE
    bound = AT_LEAST.search(comment)
    return at_least(int(bound[1])) if bound else (COUNT if default == 0 else POSITIVE_INT)


def declared(cell: str) -> list[Declared]:
    """The parameters of a notebook, read from the source of its ``parameters`` cell.

    The cell is the one place a parameter is declared: its name and default (what papermill
    overrides), its meaning, lower bound or choices, and its quick-mode value, in the comment.
    """
    found = []
    for line in cell.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        assign, _, comment = line.partition("#")
        name, _, value = assign.partition("=")
        try:
            default = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            line = line.strip()
            raise ParameterError(f"parameters cell: {line!r} is not `name = value`") from None
        name = name.strip()
        quick = QUICK.search(comment)
        found.append(
            Declared(
                name,
                default,
                comment.strip(),
                kind_of(name, default, comment),
                ast.literal_eval(quick[1]) if quick else None,
            )
        )
    return found


def parameters_cell(history: list[str]) -> str:
    """The source of the parameters cell the kernel ran last (IPython's ``In``).

    It is the latest cell, papermill's injected one aside, whose assignments begin with
    ``out_dir`` and ``quick``: every notebook of the kit opens its parameters that way.
    """
    for source in reversed(history):
        if source.lstrip().startswith(INJECTED_HEADER):
            continue
        names = [line.partition("=")[0].strip() for line in source.splitlines() if "=" in line]
        if names[:2] == ["out_dir", "quick"]:
            return source
    raise ParameterError("run the parameters cell first: it declares out_dir, quick, ...")


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


def validate(namespace: Mapping[str, Any], **kinds: Kind) -> None:
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


def apply_quick(namespace: MutableMapping[str, Any], **quick_values: Any) -> None:
    """In quick mode, set each named parameter to its quick value unless the run asked for it.

    ``quick = True`` (CI, a first try) is the smallest run that still shows every section; a
    parameter passed by name (``papermill -p epochs 3 -p quick True``) keeps the value asked
    for, so a quick run can still be sized by hand. One line says what quick mode changed and
    what it left as asked. Nothing happens in a full run (``quick = False``).
    """
    undeclared = sorted(set(quick_values) - set(namespace))
    if undeclared:
        raise ParameterError(
            f"apply_quick got {', '.join(undeclared)}, which the parameters cell does not define"
        )
    if not namespace.get("quick"):
        return
    asked = set(injected_names(list(namespace.get("In", []))))
    changed, kept = [], []
    for name, value in quick_values.items():
        if name in asked:
            kept.append(f"{name}={namespace[name]!r}")
        elif namespace[name] != value:
            changed.append(f"{name}={value!r} ({namespace[name]!r})")
            namespace[name] = value
    if changed:
        print(
            _("Quick mode uses {changed} (the full run's value in brackets).").format(
                changed=", ".join(changed)
            )
        )
    if kept:
        print(_("Quick mode keeps what this run asked for: {kept}.").format(kept=", ".join(kept)))


def adjusted(name: str, asked: Any, used: Any, *, why: str, **values: Any) -> Any:
    """``used``, after saying so when it is not the ``asked`` value of parameter ``name``.

    For the values a notebook must change to run at all on this machine or with these other
    parameters. ``why`` completes "because ...": a literal template filled with ``values``
    (``why="the run has {steps} steps", steps=n``), so ``python -m labtools.translate messages``
    finds it in the notebook and the Chinese edition says it in Chinese.
    """
    if used != asked:
        reason = _(why).format(**values)
        print(
            _("{name}: using {used} instead of {asked}, because {why}.").format(
                name=name, used=used, asked=asked, why=reason
            )
        )
    return used


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
    An ``out_dir`` given by name is held for the rest of the kernel's life (``hold``).
    """
    if not str(out_dir).strip():
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        out_dir = REPO_ROOT / "runs" / "manual" / notebook / stamp
    folder = writable(out_dir)
    hold(folder)
    (folder / "work").mkdir(exist_ok=True)
    keep_edition()  # a notebook of notebooks/zh_CN/ still answers in Chinese from its run folder
    os.chdir(folder)
    print(
        _("This run's folder (record, figures, scripts in work/): {folder}").format(folder=folder)
    )
    return folder


RUN_LOCK = ".run.lock"  # in a run's folder: the pid of the kernel whose run writes there
_HELD: dict[Path, PidLock] = {}  # folder -> this process's lock on it


def hold(folder: Path) -> None:
    """Make ``folder`` this process's run folder until it ends, or refuse in one sentence.

    Two runs started into one ``out_dir`` would overwrite each other's record, figures and
    scripts and both end well. The lock is the kernel's for its life (a rerun of the lesson in
    it takes it again), a forked child does not inherit it, and the operating system drops it
    when the kernel ends, so a folder is free again for the next run as soon as one is over.
    A kernel that moves to another folder lets go of the one before.
    """
    folder = folder.resolve()
    if folder in _HELD:
        return
    try:
        lock = PidLock(folder / RUN_LOCK, per_process=True)
    except LockHeld as held:
        raise ParameterError(
            _(
                "out_dir {folder} is in use by another run (pid {pid}); pass a folder of its "
                "own, e.g. -p out_dir {folder}-2, or wait until that run has ended."
            ).format(folder=folder, pid=held.pid)
        ) from None
    except OSError:
        return  # a file system without locks (some network mounts): the run goes on unguarded
    for other in _HELD.values():
        other.release()
    _HELD.clear()
    _HELD[folder] = lock
