"""Run many taught scripts, one after another, inside one torchrun launch (the scale lane).

A torchrun launch costs seconds before a script's first line (every rank imports torch), and
the scale lane starts every multi-rank script the lessons write at several world sizes: one
launch per world size, this driver in every rank, keeps the lane inside CI's budget. Each
case runs the script as ``__main__`` (``runpy``) with its own arguments, its results written
by ``write_rank_output`` to a folder of its own. The process group is the one thing shared:
the driver forms it once, and a script's ``init_process_group`` joins it (a second
rendezvous on torchrun's store in the same processes can read the previous group's
addresses), its ``destroy_process_group`` leaves it for the next case. What each rank saw:

- ``ran``: the script returned (or left through ``exit_without_teardown``);
- ``refused``: it raised ``ValueError``, the kit's refusal of a layout (the test then checks
  the sentence, and ``before_group`` says whether it came before ``init_process_group``);
- ``failed``: anything else, with the last line of the error.

Usage (by tests/test_scale.py): ``torchrun ... tests/scale_driver.py cases.json results/``.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from helpers import launch


class _Left(BaseException):
    """A script called exit_without_teardown: its work is done, the next case comes."""


def _leave(code: int = 0) -> None:
    raise _Left(code)


_LESSONS: set[str] = set()  # the lessons' script folders seen so far


def _use_lesson(work: Path) -> None:
    """Import the scripts of this case's lesson: forget those of another lesson (06 and 07
    both write adv_lab.py), and find siblings first in this one's folder."""
    here = str(work)
    for name, module in list(sys.modules.items()):
        where = str(getattr(module, "__file__", None) or "")
        if any(where.startswith(f"{w}/") for w in _LESSONS - {here}):
            del sys.modules[name]
    _LESSONS.add(here)
    sys.path[:] = [here, *(p for p in sys.path if p not in _LESSONS)]


class _Group:
    """The driver's one process group, standing in for each script's own."""

    joined = False  # did the running case call init_process_group yet?

    @classmethod
    def join(cls, *args, **kwargs) -> None:
        cls.joined = True

    @staticmethod
    def leave(*args, **kwargs) -> None:
        pass


def _run_case(case: dict, results: Path, rank: int) -> dict:
    work = Path(case["work"])
    _use_lesson(work)
    out = results / case["id"]
    out.mkdir(parents=True, exist_ok=True)
    os.environ[launch.OUT_ENV] = str(out)
    args = [a.replace("{results}", str(results)) for a in case["args"]]
    sys.argv = [str(work / case["script"]), *args]
    cwd, start = Path.cwd(), time.perf_counter()
    _Group.joined = False
    os.chdir(out)  # a script's relative files (checkpoints, traces) stay with its case
    try:
        runpy.run_path(str(work / case["script"]), run_name="__main__")
        status = {"status": "ran"}
    except _Left:
        status = {"status": "ran"}
    except SystemExit as exc:  # argparse, or a script's own sys.exit(message)
        status = {"status": "ran" if exc.code in (0, None) else "failed", "message": str(exc.code)}
        if exc.code not in (0, None) and not _Group.joined:
            status["status"] = "refused"
    except Exception as exc:  # noqa: BLE001  every failure is reported, none stops the lane
        status = {
            "status": "refused" if isinstance(exc, ValueError) else "failed",
            "before_group": not _Group.joined,
            "message": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-2000:],
        }
    finally:
        os.chdir(cwd)
    status["seconds"] = round(time.perf_counter() - start, 2)
    print(f"scale-case {case['id']} rank {rank}: {status['status']}", flush=True)
    return status


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    results = Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    dist.init_process_group, dist.destroy_process_group = _Group.join, _Group.leave
    launch.exit_without_teardown = _leave  # scripts bind these when run_path executes them
    rank = int(os.environ["RANK"])
    statuses: dict[str, dict] = {}
    for case in cases["cases"]:
        statuses[case["id"]] = _run_case(case, results, rank)
        (results / f"status{rank}.json").write_text(json.dumps(statuses))
        try:
            dist.barrier()  # every rank done with this case before the next begins
        except Exception as exc:  # noqa: BLE001  a rank that failed alone broke the group
            statuses[case["id"]]["broke_the_group"] = f"{type(exc).__name__}: {exc}"[:300]
            (results / f"status{rank}.json").write_text(json.dumps(statuses))
            break  # the later cases would read a broken group: they are reported not run
    sys.stdout.flush()
    os._exit(0)  # gloo threads of the scripts' meshes may outlive them: no teardown race here


if __name__ == "__main__":
    main()
