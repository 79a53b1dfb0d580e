"""World 8 in one process: the lessons' own scripts on torch's single-process rehearsal tools.

Run by tests/test_scale.py as ``python tests/scale_simulated.py LESSONS_FOLDER [CASE ...]``:
each script's ``main()`` runs as ``__main__`` with the fake process group initialised for 8
ranks. Where values matter (tensor parallel against the dense model), it runs under
``LocalTensorMode``: every DTensor holds the 8 ranks' local values and every collective
computes what the 8 ranks would, so an equality proved at 2 real ranks is checked at 8. Where
only shapes and bytes matter (bytes handed to collectives, state per rank, a 2-D plan's
placements), the fake group alone: collectives return at once, and what each call is handed
is what 8 ranks would hand.

Prints one JSON line: case -> what held, in words. Raises (exit 1) when a check fails.
"""

from __future__ import annotations

import json
import math
import os
import runpy
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed._local_tensor import LocalTensorMode, maybe_disable_local_tensor_mode
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.testing._internal.distributed.fake_pg import FakeStore

from helpers import arithmetic, launch, text
from labtools import gpu_first_runs

WORLD = 8
TOL = 1e-5


class _Left(BaseException):
    pass


def _leave(code: int = 0) -> None:
    raise _Left(code)


def _outside_local_mode(fn: Callable) -> Callable:
    """The lessons' data helpers index Python lists by drawn numbers: draw them as one process
    (the same batch on every rank, as a TP group's ranks draw it) and hand the mode plain data."""

    def wrapped(*args, **kwargs):
        with maybe_disable_local_tensor_mode():
            return fn(*args, **kwargs)

    return wrapped


def _answered_hook(state, bucket):  # no annotation: DDP checks it, and ours is a string
    """DDP's all-reduce hook on the fake group: its future carries no tensor, so DDP is handed
    the bucket back (one rank's gradients: shapes and bytes are what this harness checks)."""
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


_REAL_DDP = torch.nn.parallel.DistributedDataParallel


class _AnsweredDDP(_REAL_DDP):
    """DDP whose gradient all-reduce the fake group answers (``_answered_hook``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_comm_hook(None, _answered_hook)


def simulate(work: Path, script: str, args: list[str], values: bool) -> dict:
    """``work/script`` as rank 0 of 8 (shapes), or as all 8 at once (``values``)."""
    captured: dict = {}
    hooked = "register_comm_hook" in (work / script).read_text()  # its own hook, answered
    torch.nn.parallel.DistributedDataParallel = _REAL_DDP if hooked else _AnsweredDDP
    os.environ.update(WORLD_SIZE=str(WORLD), RANK="0", LOCAL_RANK="0")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    real_init, real_destroy = dist.init_process_group, dist.destroy_process_group
    dist.init_process_group = lambda *a, **k: None  # the script's own: the fake group is up
    dist.destroy_process_group = lambda *a, **k: None
    launch.write_rank_output = lambda data, rank=None: captured.update(data)
    launch.exit_without_teardown = _leave
    sys.argv = [str(work / script), *args]
    cwd = Path.cwd()
    os.chdir(work)
    try:
        with LocalTensorMode(WORLD) if values else nullcontext():
            runpy.run_path(str(work / script), run_name="__main__")
    except _Left:
        pass
    finally:
        os.chdir(cwd)
        dist.init_process_group, dist.destroy_process_group = real_init, real_destroy
        real_destroy()
    return captured


def check_tp_core(out: dict) -> str:
    worst = max(out["max_diff"], out["max_grad_diff"])
    assert worst <= TOL, worst
    assert out["forward_comms"] == {"all_reduce": 1} == out["backward_comms"], out
    return f"simulated (LocalTensor): TP block = dense ({worst:.1e}), 1 all-reduce each way"


def check_tp_gpt(out: dict) -> str:
    assert out["mesh"] == [[0, 1, 2, 3], [4, 5, 6, 7]], out["mesh"]  # tp 4: the 4 heads
    worst = max(
        max(r["max_diff_logits"], r["max_diff_after_step"]) for r in (out["tp"], out["tp_sp"])
    )
    assert worst <= TOL, worst
    assert out["tp"]["per_block"] == {"all_reduce": 2}
    assert out["tp_sp"]["per_block"] == {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2}
    assert all(r["per_block_backward"] == r["per_block"] for r in (out["tp"], out["tp_sp"]))
    return f"simulated (LocalTensor): TP, TP+SP = dense ({worst:.1e}) on a 2 x 4 mesh"


def check_tp_2d(out: dict) -> str:
    assert out["mesh"] == [[0, 1], [2, 3], [4, 5], [6, 7]], out["mesh"]
    full, placements, local = out["q"]
    assert local == [full[0] // WORLD, full[1]], out["q"]  # split by tp 2, then by dp 4
    return f"simulated (fake group): 4 x 2 plan, q {full} -> {local} per rank"


def check_comm_bytes(out: dict) -> str:
    assert out["tp_block"]["tp"] == math.gcd(WORLD, 4)
    assert not gpu_first_runs.comm_bytes_differ(out, WORLD)
    return "simulated (fake group): DDP, ZeRO-2/3 and TP (tp 4) bytes = formulas"


def check_zero_memory(out: dict) -> str:
    for stage, name in enumerate(("ddp", "zero1", "zero2", "zero3")):
        assert out[name] == arithmetic.state_bytes_per_rank(
            gpu_first_runs.gpt_shapes(), WORLD, stage
        ), name
    assert out["hsdp"] == arithmetic.state_bytes_per_rank(
        gpu_first_runs.gpt_shapes(), WORLD // 2, 3
    )
    return "simulated (fake group): DDP, ZeRO-1/2/3, HSDP bytes per rank = formulas"


GPT_ARGS = ["96", "64", "2", "8", "64"]
CASES = {  # case: (lesson, script, arguments, values?, check)
    "tp_core": ("09_tensor_parallel", "tp_core.py", [], True, check_tp_core),
    "tp_gpt": ("09_tensor_parallel", "tp_gpt.py", [], True, check_tp_gpt),
    "tp_2d": ("09_tensor_parallel", "tp_2d.py", ["1", "8", "3e-3"], False, check_tp_2d),
    "comm_bytes": (
        "12_arithmetic_of_parallelism",
        "comm_bytes.py",
        GPT_ARGS,
        False,
        check_comm_bytes,
    ),
    "zero_memory": (
        "12_arithmetic_of_parallelism",
        "zero_memory.py",
        GPT_ARGS,
        False,
        check_zero_memory,
    ),
}


def main() -> None:
    lessons = Path(sys.argv[1])
    text.batch = _outside_local_mode(text.batch)
    default_hooks.allreduce_hook = _answered_hook
    verdicts = {}
    only = set(sys.argv[2:]) or set(CASES)  # names given: only those cases
    for name, (lesson, script, args, values, check) in CASES.items():
        if name not in only:
            continue
        work = lessons / lesson / "work"
        sys.path[:] = [str(work), *(p for p in sys.path if not p.startswith(str(lessons)))]
        verdicts[name] = check(simulate(work, script, args, values))
        print(f"{name}: {verdicts[name]}", file=sys.stderr, flush=True)
    print(json.dumps(verdicts))


if __name__ == "__main__":
    main()
