# Generated from notebooks/02_distributed_data_parallel.ipynb (work/ddp_train.py) by `make scripts`.
# Edit the notebook's cell, not this file: a test fails when the two differ.
"""Train SimpleCNN on MNIST with DistributedDataParallel. Start it with torchrun."""
import argparse
import contextlib
import itertools
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before init_process_group: see Part 8
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from helpers.data import make_loader, mnist_once
from helpers.launch import write_rank_output
from helpers.models import SimpleCNN
from helpers.progress import progress_line
from helpers.train import Throughput, exact_fp32

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--max-steps", type=int, default=None, help="stop early (a short demo)")
parser.add_argument("--threads", type=int, default=0, help="CPU threads; 0: cores / local ranks")
parser.add_argument("--batch-size", type=int, default=64, help="per rank")
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--snapshot-steps", type=int, nargs="*", default=[1, 5, 10, 20])
parser.add_argument("--exact", action="store_true", help="IEEE fp32 on GPUs, for the proof")
parser.add_argument("--checkpoint", default=None, help="checkpoint file; resume from it")
parser.add_argument("--checkpoint-every", type=int, default=20)
parser.add_argument("--fail-once-at-step", type=int, default=None, help="rank 1 dies there once")
parser.add_argument("--accum-steps", type=int, default=1, help="gradient accumulation")
parser.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
args = parser.parse_args()
local_rank = int(os.environ["LOCAL_RANK"])
local_ranks = int(os.environ["LOCAL_WORLD_SIZE"])  # processes on this node
cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
torch.set_num_threads(args.threads or max(1, cores // local_ranks))  # this rank's share
if torch.cuda.is_available():
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick its fastest conv
    if args.exact:  # the proof compares IEEE fp32 maths: no TF32, the same conv algorithms
        exact_fp32()
    backend = "nccl"
else:
    device, backend = torch.device("cpu"), "gloo"
dist.init_process_group(backend, timeout=timedelta(seconds=120),
                        device_id=device if backend == "nccl" else None)
rank, world_size = dist.get_rank(), dist.get_world_size()
master = rank == 0  # only rank 0 prints and saves
out = Path(os.environ.get("MULTIGPU_LAB_OUT", "."))
restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # set by torchrun
train_set, kind = mnist_once(train=True)  # global rank 0 first, the others wait
test_set, _ = mnist_once(train=False)
sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed, drop_last=True)
loader = make_loader(train_set, args.batch_size, sampler=sampler)
test_loader = make_loader(test_set, 500, sampler=DistributedSampler(test_set, shuffle=False))
torch.manual_seed(args.seed)
model = SimpleCNN().to(device)
model = DDP(model, device_ids=[local_rank] if backend == "nccl" else None)
allreduces = 0  # gradient buckets all-reduced so far, counted by the hook below


def counting_allreduce(state, bucket):
    """DDP's own all-reduce of one gradient bucket (the mean over the ranks), counted."""
    global allreduces
    allreduces += 1
    return default_hooks.allreduce_hook(state, bucket)


model.register_comm_hook(None, counting_allreduce)  # None: the default process group
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
start_step = 0
if args.checkpoint and Path(args.checkpoint).exists():
    state = torch.load(args.checkpoint, map_location=device, weights_only=True)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])  # fp16: the loss scale reached so far
    start_step = state["step"]
    if master:
        print(f"resumed from step {start_step} after restart {restarts}", flush=True)


def save_atomic(obj, path) -> None:
    """Write a temporary file, then rename it: a crash never leaves half a file at `path`."""
    tmp = Path(path).with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # atomic on POSIX: a reader sees the old file or the new one


def save_checkpoint(step: int) -> None:
    if master:
        save_atomic({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                     "scaler": scaler.state_dict(), "step": step}, args.checkpoint)
    dist.barrier()  # nobody runs ahead of a checkpoint it may need
comm = {"per_step": [], "skipped": 0}  # all-reduces per step / in no_sync micro-batches


def train_step(batch, sync: bool) -> torch.Tensor:
    x, y = (t.to(device, non_blocking=True) for t in batch)
    before = allreduces
    # Forward AND backward inside no_sync(): DDP reads the flag in forward.
    with contextlib.nullcontext() if sync else model.no_sync():
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = F.cross_entropy(model(x), y) / args.accum_steps
        scaler.scale(loss).backward()  # when synchronising, DDP all-reduces buckets in here
    if sync:
        comm["per_step"].append(allreduces - before)
    else:
        comm["skipped"] += allreduces - before
    return loss.detach() * args.accum_steps
steps_per_epoch = len(loader) // args.accum_steps
last_step = args.max_steps or args.epochs * steps_per_epoch
timer = Throughput(device, warmup=5)
losses, step = [], start_step
for epoch in range(start_step // steps_per_epoch, args.epochs):
    sampler.set_epoch(epoch)
    skip = (step - epoch * steps_per_epoch) * args.accum_steps
    batches = itertools.islice(iter(loader), skip, None)
    while step < min((epoch + 1) * steps_per_epoch, last_step):
        for micro in range(args.accum_steps):
            loss = train_step(next(batches), sync=micro == args.accum_steps - 1)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        losses.append(loss)
        timer.step(args.batch_size * args.accum_steps)
        if master and step in args.snapshot_steps:
            torch.save(model.module.state_dict(), out / f"params_step{step}.pt")
        if args.fail_once_at_step == step and rank == 1 and restarts == 0:
            print(f"rank 1: dying on purpose at step {step}", flush=True)
            os._exit(1)
        if args.checkpoint and step % args.checkpoint_every == 0:
            save_checkpoint(step)
        if step % 5 == 0 or step == last_step:  # every rank: the notebook draws a bar per rank
            print(progress_line(step, last_step, loss, timer.samples_per_s), flush=True)
model.eval()
counts = torch.zeros(2, device=device)
with torch.no_grad():
    for x, y in test_loader:
        x, y = x.to(device), y.to(device)
        counts += torch.tensor([(model(x).argmax(1) == y).sum(), len(y)], device=device)
dist.all_reduce(counts)
accuracy = (counts[0] / counts[1]).item()
if master:
    print(f"test accuracy {accuracy:.4f} on {int(counts[1])} images ({kind})", flush=True)
    save_atomic(model.module.state_dict(), out / "params_final.pt")
write_rank_output({"rank": rank, "world_size": world_size, "backend": backend, "dataset": kind,
                   "accuracy": accuracy, "losses": [float(v) for v in losses], "steps": step,
                   "restarts": restarts, "resumed_from_step": start_step, "amp": args.amp,
                   "samples_per_s": timer.samples_per_s, "threads": torch.get_num_threads(),
                   "cpu_ms_per_sample": timer.cpu_ms_per_sample, "accum_steps": args.accum_steps,
                   "optimizer_steps": step - start_step, "allreduces": comm})
model = optimizer = None  # DDP holds the process group: let go of it ...
dist.destroy_process_group()  # ... so that this ends the group and joins its threads
