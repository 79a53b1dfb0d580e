"""One call opens a lesson: its parameters checked, its run folder, its device plan, its record.

Every lesson begins the same way, so that the first thing a learner reads is the lesson:

    from helpers import lesson
    rec, plan = lesson.start("02_distributed_data_parallel", globals(), min_ranks=2)

The parameters cell above that call is the one place a parameter is declared (see
``params.declared``): papermill overrides its values, and its comments give each parameter's
kind and its quick-mode value. ``start`` checks them, applies quick mode, moves into the run's
own folder (where a rerun of a ``%%writefile`` cell keeps a learner's edits of the script:
``cell_scripts.keep_edits``), asks ``env.device_plan`` where the workers go, and opens the
record that the lesson's last line, ``rec.write()``, saves.
"""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping
from typing import Any

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # the kernel never initialises CUDA

from helpers import cell_scripts, env, params  # noqa: E402  (after the line above: it must precede torch)
from helpers.messages import _  # noqa: E402
from helpers.paths import NOTEBOOKS  # noqa: E402
from helpers.record import Record  # noqa: E402


def _parameters_source(notebook: str, namespace: MutableMapping[str, Any]) -> str:
    """The parameters cell this kernel ran (IPython's ``In``), else the lesson file's own.

    A client that runs cells without storing history (nbval: ``store_history=False``) leaves
    ``In`` empty; every edition of a lesson shares the English parameters cell, so it is read
    from ``notebooks/<notebook>.ipynb`` then.
    """
    try:
        return params.parameters_cell(list(namespace.get("In", [])))
    except params.ParameterError:
        path = NOTEBOOKS / f"{notebook}.ipynb"
        if not path.exists():
            raise
    cells = json.loads(path.read_text())["cells"]
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    return "".join(tagged[0]["source"]) if tagged else ""


def start(
    notebook: str,
    namespace: MutableMapping[str, Any],
    *,
    min_ranks: int = 1,
    max_ranks: int | None = None,
) -> tuple[Record, dict[str, Any] | None]:
    """Check the parameters, apply quick mode, enter the run folder; return (record, plan).

    ``min_ranks``/``max_ranks`` go to ``env.device_plan``: the ranks the lesson's jobs need
    (two for DDP against one process, a rank to kill, two pipeline stages). A parameter named
    ``world_size`` caps them. ``min_ranks=0``: the lesson starts no workers and has no plan.
    """
    declared = params.declared(_parameters_source(notebook, namespace))
    params.validate(namespace, **{p.name: p.kind for p in declared if p.name not in params.COMMON})
    quick = {p.name: p.quick for p in declared if p.quick is not None}
    params.apply_quick(namespace, **quick)
    namespace["out_dir"] = params.use_run_folder(notebook, namespace["out_dir"])
    cell_scripts.keep_edits()  # a script edited in JupyterLab survives a rerun of its cell
    plan = None
    if min_ranks:
        cap = namespace.get("world_size") or max_ranks
        plan = env.device_plan(min_ranks=min_ranks, max_ranks=max(cap, min_ranks) if cap else None)
        print(_("Found: {device} -> {why}").format(device=plan["device"], why=plan["why"]))
        _announce_world_size(namespace.get("world_size"), plan, min_ranks)
    values = {p.name: namespace[p.name] for p in declared if p.name != "out_dir"}
    return Record(notebook, namespace["out_dir"], params=values, plan=plan), plan


def _announce_world_size(asked: Any, plan: dict[str, Any], min_ranks: int) -> None:
    """A ``world_size`` the plan cannot give is said in one line (``params.adjusted``)."""
    if not asked or asked == plan["nproc"]:
        return
    if asked < min_ranks:
        why = _("this lesson needs at least {n} ranks")
    elif plan["worker_device"] == "cuda":
        why = _("only {n} GPU(s) are visible and one GPU holds one NCCL rank")
    else:
        why = _("without {ranks} GPUs the lesson runs {n} CPU processes with gloo, its CPU plan")
    params.adjusted("world_size", asked, plan["nproc"], why=why, ranks=asked, n=plan["nproc"])
