"""The scale lane: every multi-rank script the lessons write, at world sizes 1, 3, 4 and 8.

A learner runs the kit on one GPU or on an 8-GPU node; CI proves it on 2 CPU processes. This
lane starts each script at other world sizes and checks that it either runs correctly (the
equality its lesson proves still holds) or refuses before starting, with one sentence naming
the constraint (``tensor parallel ... must divide the 4 attention heads``).

- Worlds 1, 3 and 4 are real gloo processes: one torchrun launch per world size runs every
  case in turn (``tests/scale_driver.py``), since a launch costs seconds before a script's first
  line. 4 is the most processes the launcher starts on 2 cores.
- World 8 is simulated in one process (``tests/scale_simulated.py``): torch's fake process
  group for plans and shapes, and ``torch.distributed._local_tensor`` (LocalTensor: every
  rank's values, computed in one process) where values matter. What LocalTensor cannot
  rehearse in torch 2.14 (FSDP2, a rank's own seed, data-dependent all_to_all splits) runs as
  8 real gloo processes on the 2 cores, in one plain torchrun launch.

``make scale`` runs the lane alone and prints its table (script x world -> ran / refused /
simulated, and what was checked).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import arithmetic, cell_scripts, launch, paths
from helpers.procs import kill_tree
from labtools import exported_scripts, gpu_first_runs

pytestmark = pytest.mark.scale

REAL_WORLDS = (1, 3, 4)
SIMULATED_WORLD = 8
TOL = 1e-5  # the lessons' bound for float rounding of another summation order
Outputs = dict[int, dict]  # rank -> what that rank wrote (write_rank_output)
TABLE = Path(__file__).parent.parent / "runs" / "scale-lane.md"


@dataclass(frozen=True)
class Case:
    """One script of a lesson, its arguments in the lane, and what must hold at each world.

    ``check(outputs, world)`` asserts on the ranks' outputs and returns what it checked, in
    words, for the table. ``refuses(world)`` is a phrase of the refusal expected at that world
    (None: it must run).
    """

    notebook: str
    script: str
    args: tuple[str, ...] = ()
    check: Callable[[Outputs, int], str] | None = None
    refuses: Callable[[int], str | None] = field(default=lambda world: None)
    name: str = ""

    @property
    def id(self) -> str:
        return self.name or Path(self.script).stem


def ran(outputs: Outputs, world: int) -> str:
    return "ran"


def smoke_sum(outputs: Outputs, world: int) -> str:
    for out in outputs.values():
        assert out["value"] == [world * (world + 1) / 2]
    return "sum = 1 + ... + world on every rank"


ADAM_TOL = 1e-4  # weights after AdamW: its first steps divide each gradient by its own size


def fsdp_equal(outputs: Outputs, world: int) -> str:
    """The global loss (the mean of the ranks' equal slices) equals one process's to 1e-5; the
    weights to 1e-4: Adam magnifies the rounding of near-zero gradients (measured 4.4e-5 at 3
    ranks after 2 steps at lr 1e-2, 3.4e-5 at 8 ranks at lr 1e-3; 2 ranks stay under 1e-5)."""
    reference = outputs[0]["reference_losses"]
    losses = [sum(o["losses"][i] for o in outputs.values()) / world for i in range(len(reference))]
    loss_diff = max(abs(a - b) for a, b in zip(losses, reference, strict=True))
    weights = outputs[0]["max_param_diff"]
    assert loss_diff <= TOL and weights <= ADAM_TOL, (loss_diff, weights)
    return f"FSDP = one process: loss {loss_diff:.1e}, weights {weights:.1e}"


def tp_core_equal(outputs: Outputs, world: int) -> str:
    out = outputs[0]
    assert max(out["max_diff"], out["max_grad_diff"]) <= TOL
    if world > 1:
        assert out["forward_comms"] == {"all_reduce": 1} == out["backward_comms"]
    return f"TP block = dense ({max(out['max_diff'], out['max_grad_diff']):.1e}), 1 all-reduce"


def tp_gpt_equal(outputs: Outputs, world: int) -> str:
    out = outputs[0]
    tp = math.gcd(world, 4)
    assert out["mesh"] == [list(range(r * tp, (r + 1) * tp)) for r in range(world // tp)]
    worst = max(
        max(r["max_diff_logits"], r["max_diff_after_step"]) for k, r in out.items() if k != "mesh"
    )
    assert worst <= TOL, worst
    assert out["tp"]["per_block"] == {"all_reduce": 2}
    assert out["tp_sp"]["per_block"] == {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2}
    assert all(r["per_block_backward"] == r["per_block"] for r in (out["tp"], out["tp_sp"]))
    return f"TP, TP+SP = dense ({worst:.1e}) on a {world // tp} x {tp} mesh"


def tp_2d_equal(outputs: Outputs, world: int) -> str:
    out = outputs[0]
    diff = max(abs(a - b) for a, b in zip(out["losses"], out["reference_losses"], strict=True))
    assert diff <= TOL, diff
    assert out["mesh"] == [[2 * r, 2 * r + 1] for r in range(world // 2)]
    return f"2-D (dp {world // 2} x tp 2) loss = one process ({diff:.1e})"


def pipeline_equal(outputs: Outputs, world: int) -> str:
    assert all(o["equal_to_unsplit"] for o in outputs.values())
    diff = max(max(o["param_diff"].values()) for o in outputs.values())
    return f"GPipe, 1F1B = unsplit ({diff:.1e})"


def ring_equal(outputs: Outputs, world: int) -> str:
    diff = max(out["max_diff"] for out in outputs.values())
    assert diff <= TOL, diff
    return f"ring = full causal attention ({diff:.1e})"


def zigzag_equal(outputs: Outputs, world: int) -> str:
    diff = max(outputs[0][split]["max_diff"] for split in ("contiguous", "zigzag"))
    assert diff <= TOL, diff
    work = [outputs[r]["zigzag"]["work"] for r in range(world)]
    assert len(set(work)) == 1, work  # the zig-zag split evens the causal work
    return f"both splits = full attention ({diff:.1e}); zig-zag work even"


def moe_equal(outputs: Outputs, world: int) -> str:
    diff = max(max(o["max_diff"], o["max_grad_diff"]) for o in outputs.values())
    assert diff <= TOL, diff
    return f"EP = one-process MoE ({diff:.1e})"


def torch_cp_reported(outputs: Outputs, world: int) -> str:
    out = outputs[0]
    if "max_diff" in out:
        assert out["max_diff"] <= TOL
        return f"context_parallel = full ({out['max_diff']:.1e})"
    assert out["error"]
    return "context_parallel: its error on CPU, reported"


GPT_ARGS = ("96", "64", "2", "8", "64")  # vocab, width, layers, batch, seq (notebook 12)


def comm_equal(outputs: Outputs, world: int) -> str:
    out = outputs[0]
    assert (out["tp_block"] is None) == (math.gcd(world, 4) < 2), out["tp_block"]
    assert not gpu_first_runs.comm_bytes_differ(out, world)
    return "DDP, ZeRO-2/3, TP bytes = formulas"


def zero_equal(outputs: Outputs, world: int) -> str:
    out = outputs[0]
    for stage, name in enumerate(("ddp", "zero1", "zero2", "zero3")):
        if world > 1 or stage == 0:
            assert out[name] == arithmetic.state_bytes_per_rank(
                gpu_first_runs.gpt_shapes(), world, stage
            ), name
    return "DDP, ZeRO-1/2/3 bytes per rank = formulas"


PIPELINE = ("--steps", "2", "--batch", "16", "--microbatches", "4")


def two_stages(world: int) -> str | None:  # notebook 10's pipeline: one stage per rank, 2 stages
    return "has 2 stages: run it on 2 ranks" if world != 2 else None


ADV_CFG = json.dumps({"d_in": 32, "dim": 64, "hidden": 256, "depth": 4, "classes": 10})
ADV = ("--cfg", ADV_CFG, "--steps", "2", "--batch", "24", "--repeats", "1")
MNIST_STEPS = ("--max-steps", "2", "--snapshot-steps")

CASES = [
    Case("00_environment", "smoke_allreduce.py", check=smoke_sum),
    Case("00_environment", "allreduce_sweep.py", ("--sizes", "256", "--repeats", "1"), ran),
    Case(
        "02_distributed_data_parallel",
        "ddp_core.py",
        ("--epochs", "1", "--steps-per-epoch", "2"),
        ran,
    ),
    Case("02_distributed_data_parallel", "ddp_train.py", MNIST_STEPS, ran),
    Case("02_distributed_data_parallel", "ddp_accum.py", (*MNIST_STEPS, "--accum-steps", "2"), ran),
    Case(
        "02_distributed_data_parallel",
        "ddp_elastic.py",
        (*MNIST_STEPS, "--checkpoint", "ckpt.pt", "--checkpoint-every", "1"),
        ran,
    ),
    Case(
        "02_distributed_data_parallel",
        "ddp_lr.py",
        ("--samples", "96", "--every", "48", "--batch-size", "24"),
        ran,
    ),
    Case("03_mixed_precision", "ddp_amp.py", ("--amp", "bf16", *MNIST_STEPS), ran),
    Case("03_mixed_precision", "ddp_amp_overflow.py", ("--amp", "fp16", *MNIST_STEPS), ran),
    Case(
        "04_dataloader_tuning",
        "loader_ddp.py",
        ("--workers", "0", "--side", "28", "--steps", "2"),
        ran,
    ),
    Case(
        "04_dataloader_tuning",
        "loader_train.py",
        ("--model", "mlp", "--workers", "0", "--steps", "2", "--side", "28"),
        ran,
    ),
    Case("05_profiling", "profile_core.py", ("16", "1"), ran),
    Case("05_profiling", "straggler.py", (), ran),
    Case(
        "05_profiling", "profile_ddp.py", ("--out", ".", "--active", "1", "--max-seconds", "1"), ran
    ),
    *(
        Case(nb, "adv_lab.py", ("--part", part, *ADV), ran, name=f"adv_{part}")
        for nb, parts in (
            ("06_ddp_in_practice", ("uneven", "unused", "buckets", "syncbn", "clip")),
            ("07_memory_and_zero", ("memory", "ac", "zero")),
        )
        for part in parts
    ),
    Case("06_ddp_in_practice", "job_ddp.py", ("--n-train", "96", "--batch", "8"), ran),
    Case("07_memory_and_zero", "bytes_held.py", ("--cfg", ADV_CFG, "--rows", "8"), ran),
    Case("08_fully_sharded_data_parallel", "shard_fsdp.py", ("2", "24", "0.01"), ran),
    Case(
        "08_fully_sharded_data_parallel",
        "shard_equal.py",
        ("2", "24", "0.01", "fsdp.pt"),
        fsdp_equal,
    ),
    Case("08_fully_sharded_data_parallel", "shard_memory.py", ("24", "blocks"), ran),
    Case("08_fully_sharded_data_parallel", "shard_mp.py", ("4", "24", "0.01"), ran),
    Case("08_fully_sharded_data_parallel", "shard_practice.py", ("24", "2", "1.0"), ran),
    Case("08_fully_sharded_data_parallel", "shard_knobs.py", ("32", "2", "24", "3"), ran),
    Case(
        "08_fully_sharded_data_parallel", "shard_dcp.py", ("2", "24", "0.01", "{results}/dcp"), ran
    ),
    Case("08_fully_sharded_data_parallel", "shard_reload.py", ("{results}/dcp",), ran),
    Case(
        "09_tensor_parallel",
        "tp_core.py",
        (),
        tp_core_equal,
        lambda world: "does not divide the 256 features" if 256 % world else None,
    ),
    Case(
        "09_tensor_parallel",
        "tp_gpt.py",
        (),
        tp_gpt_equal,
        lambda world: (
            "must divide the world, the 4 attention heads" if math.gcd(world, 4) < 2 else None
        ),
    ),
    Case(
        "09_tensor_parallel",
        "tp_2d.py",
        ("4", "24", "3e-3"),
        tp_2d_equal,
        lambda world: "needs an even world of 4 ranks or more" if world < 4 or world % 2 else None,
    ),
    Case("10_pipeline_parallel", "pipeline_train.py", PIPELINE, pipeline_equal, two_stages),
    Case("10_pipeline_parallel", "pipeline_core.py", PIPELINE, ran, two_stages),
    Case("11_context_and_expert_parallel", "cp_ring.py", ("96",), ring_equal),
    Case(
        "11_context_and_expert_parallel",
        "cp_ring.py",
        ("98",),
        ring_equal,
        lambda world: "does not split into" if 98 % world else None,
        name="cp_ring_98_tokens",
    ),
    Case("11_context_and_expert_parallel", "cp_zigzag.py", ("96",), zigzag_equal),
    Case("11_context_and_expert_parallel", "torch_cp.py", ("96",), torch_cp_reported),
    Case("11_context_and_expert_parallel", "moe_ep.py", ("64", "1"), moe_equal),
    Case("12_arithmetic_of_parallelism", "comm_bytes.py", GPT_ARGS, comm_equal),
    Case("12_arithmetic_of_parallelism", "zero_memory.py", GPT_ARGS, zero_equal),
    Case("12_arithmetic_of_parallelism", "collectives.py", ("4096", "1", "{}"), ran),
    Case("12_arithmetic_of_parallelism", "wire_bytes.py", ("65536", "1"), ran),
    Case("13_troubleshooting", "trouble_job.py", ("--mode", "ok"), ran),
]

# Scripts the lessons write that this lane does not start, and why. A new script must be
# added to CASES or here (test_every_script_a_lesson_writes_is_in_the_lane).
NOT_STARTED = {
    "adv_model.py": "a module adv_lab.py imports (06, 07)",
    "adv_data.py": "a module adv_lab.py imports (06, 07)",
    "adv_common.py": "a module the adv_<part>.py parts import (06, 07)",
    "adv_uneven.py": "a part adv_lab.py runs (the adv_uneven case)",
    "adv_unused.py": "a part adv_lab.py runs (the adv_unused case)",
    "adv_buckets.py": "a part adv_lab.py runs (the adv_buckets case)",
    "adv_syncbn.py": "a part adv_lab.py runs (the adv_syncbn case)",
    "adv_clip.py": "a part adv_lab.py runs (the adv_clip case)",
    "adv_memory.py": "a part adv_lab.py runs (the adv_memory case)",
    "adv_ac.py": "a part adv_lab.py runs (the adv_ac case)",
    "adv_zero.py": "a part adv_lab.py runs (the adv_zero case)",
    "adv_compile.py": "torch.compile: 25-35 s cold per rank on CPU; notebook 06 compiles on GPUs",
    "job_common.py": "a module job_ddp.py, job_accelerate.py and job_fabric.py import",
    "job_accelerate.py": "Accelerate owns its launch and imports for ~10 s per rank; run by 06",
    "job_fabric.py": "Lightning Fabric owns its launch and imports for ~10 s per rank; run by 06",
    "activation_memory.py": "one process by design (activations of one device)",
    "mfu.py": "one process by design (one device's matmul peak)",
    "fake_layout.py": "one process playing ranks 0 and 63 of 64 (the fake process group)",
    "multinode_probe.py": "two hosts by design: notebook 14 starts it on 2 nodes",
    "trouble_ports.py": "fails on purpose (notebook 13): a port already taken",
    "trouble_workers.py": "fails on purpose (notebook 13)",
    "trouble_cuda_fork.py": "fails on purpose (notebook 13): CUDA before fork",
    "trouble_fork.py": "hangs on purpose (notebook 13): fork after a torch op",
    "trouble_orphan.py": "leaves a process on purpose (notebook 13)",
    "trouble_shm.py": "fails on purpose (notebook 13): shared memory",
    "trouble_cuda0.py": "wrong on purpose (notebook 13): every rank on cuda:0",
    "trouble_skew.py": "slow on purpose (notebook 13): a straggling rank",
    "trouble_leak.py": "leaks on purpose (notebook 13): a port held after a crash",
}


@dataclass
class Run:
    """What one case did at one world size: each rank's status and outputs."""

    status: dict[int, dict]
    outputs: Outputs


DRIVER = Path(__file__).with_name("scale_driver.py")


def run_world(
    world: int, folders: dict[str, Path], results: Path, cases: list[Case] = CASES
) -> dict[str, Run]:
    """Every case at ``world`` in one torchrun launch of tests/scale_driver.py."""
    spec = results / "cases.json"
    results.mkdir(parents=True, exist_ok=True)
    spec.write_text(
        json.dumps(
            {
                "cases": [
                    {"id": c.id, "work": str(folders[c.notebook]), "script": c.script}
                    | {"args": list(c.args)}
                    for c in cases
                ]
            }
        )
    )
    if world <= 4:  # the kit's launcher: the most processes it starts on 2 cores is 4
        try:
            launch.torchrun(
                DRIVER,
                [str(spec), str(results)],
                nproc=world,
                device="cpu",
                timeout=1200,
                max_lines=0,
                out_dir=results / "launch",
            )
        except launch.WorkerFailed:
            pass  # a case broke the group: its status says which, the later ones did not run
    else:
        oversubscribed(world, [str(DRIVER), str(spec), str(results)], results)
    statuses = {}
    for r in range(world):
        path = results / f"status{r}.json"
        statuses[r] = json.loads(path.read_text()) if path.exists() else {}
    runs = {}
    for c in cases:
        missing = {"status": "not run", "message": "an earlier case broke the process group"}
        status = {r: statuses[r].get(c.id, missing) for r in range(world)}
        outputs = {
            r: json.loads(p.read_text())
            for r in range(world)
            if (p := results / c.id / f"rank{r}.json").exists()
        }
        runs[c.id] = Run(status, outputs)
    return runs


def oversubscribed(world: int, argv: list[str], results: Path) -> None:
    """Plain torchrun with more processes than the launcher allows on this machine's cores
    (8 on 2: slow, and correct); its whole process group ended on a timeout."""
    env = {**os.environ, "PYTHONPATH": str(paths.REPO_ROOT), "OMP_NUM_THREADS": "1"}
    env |= launch.worker_env("cpu")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={world}", *argv]
    with open(results / "torchrun.log", "w") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            proc.wait(timeout=1200)
        finally:
            kill_tree(proc)


# Equalities LocalTensor cannot rehearse in torch 2.14 (FSDP2 resizes its storages; a rank's
# own seed and data-dependent all_to_all splits are Python values), run as 8 real processes.
EIGHT_PROCESSES = ("shard_equal", "tp_2d", "cp_ring", "cp_zigzag", "moe_ep")


@pytest.fixture(scope="session")
def eight_processes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("scale8")
    folders = exported_scripts.lesson_folders(root / "lessons")
    cases = [c for c in CASES if c.id in EIGHT_PROCESSES]
    return run_world(SIMULATED_WORLD, folders, root / "world8", cases)


@pytest.mark.parametrize("case", [c for c in CASES if c.id in EIGHT_PROCESSES], ids=lambda c: c.id)
def test_equalities_hold_on_8_processes(case: Case, eight_processes, no_orphans) -> None:
    run = eight_processes[case.id]
    statuses = {s["status"] for s in run.status.values()}
    assert statuses == {"ran"}, {r: s.get("traceback", s) for r, s in run.status.items()}
    verdict(case.id, SIMULATED_WORLD, "8 processes: " + case.check(run.outputs, SIMULATED_WORLD))


@pytest.fixture(scope="session")
def scale_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Run]]:
    root = tmp_path_factory.mktemp("scale")
    folders = exported_scripts.lesson_folders(root / "lessons")
    return {world: run_world(world, folders, root / f"world{world}") for world in REAL_WORLDS}


VERDICTS: dict[tuple[str, int], str] = {}  # (case, world) -> the table's cell


def verdict(case: str, world: int, said: str) -> None:
    VERDICTS[case, world] = "; ".join(filter(None, [VERDICTS.get((case, world)), said]))


@pytest.mark.parametrize("world", REAL_WORLDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_script_runs_correctly_or_refuses_up_front(
    case: Case, world: int, scale_runs, no_orphans
) -> None:
    run = scale_runs[world][case.id]
    statuses = {s["status"] for s in run.status.values()}
    expected = case.refuses(world)
    if expected is not None:
        messages = {s.get("message", "") for s in run.status.values()}
        VERDICTS[case.id, world] = "refused: " + next(iter(messages)).split(": ", 1)[-1]
        assert statuses == {"refused"}, run.status
        assert len(messages) == 1 and expected in next(iter(messages)), messages
        return
    assert statuses == {"ran"}, {r: s.get("traceback", s) for r, s in run.status.items()}
    VERDICTS[case.id, world] = case.check(run.outputs, world) if case.check else "ran"


def test_every_script_a_lesson_writes_is_in_the_lane() -> None:
    stems = sorted(p.stem for p in paths.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    written = {Path(w).name for s in stems for w, _, _ in cell_scripts.writefile_cells(s)}
    started = {c.script for c in CASES}
    assert written - started - set(NOT_STARTED) == set(), "add them to CASES or NOT_STARTED"
    assert set(NOT_STARTED) & started == set()
    assert set(NOT_STARTED) <= written, "NOT_STARTED names a script no lesson writes"


def test_world_8_simulated_in_one_process(tmp_path: Path, no_orphans) -> None:
    """World 8 in one process: the fake process group and LocalTensor (tests/scale_simulated.py)."""
    folders = exported_scripts.lesson_folders(tmp_path / "lessons")
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("scale_simulated.py")),
            str(tmp_path / "lessons"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(paths.REPO_ROOT)},
        cwd=folders["09_tensor_parallel"],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name, said in results.items():
        verdict(name, SIMULATED_WORLD, said)


def test_zz_print_the_lane_table(scale_runs, no_orphans) -> None:
    """The table of the closing note; `make scale` shows it (and writes runs/scale-lane.md).
    Last in the file, so the lane's other tests have filled VERDICTS; it asks for the runs
    itself, so the unit lane never writes an empty table."""
    worlds = (*REAL_WORLDS, SIMULATED_WORLD)
    lines = ["| script | " + " | ".join(f"world {w}" for w in worlds) + " |"]
    lines.append("|---" * (len(worlds) + 1) + "|")
    names = [c.id for c in CASES] + sorted(
        {n for n, w in VERDICTS if w == SIMULATED_WORLD} - {c.id for c in CASES}
    )
    for name in names:
        cells = [VERDICTS.get((name, w), "–").replace("|", "/") for w in worlds]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append(
        f"\n–: not started at {SIMULATED_WORLD}. These 2 cores hold 8 processes for the equalities"
        " LocalTensor cannot simulate; the others are world-agnostic (DistributedSampler, DDP) and"
        f" ran at {', '.join(map(str, REAL_WORLDS))}; a 2-stage pipeline refuses any world but 2."
    )
    TABLE.parent.mkdir(exist_ok=True)
    TABLE.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
