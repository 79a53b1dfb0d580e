#!/usr/bin/env python3
"""A two-node Slurm cluster on this one machine: a controller and two compute nodes.

    python3 cluster/slurm/localcluster.py up       # or: make slurm-up
    SLURM_CONF=cluster/slurm/local/etc/slurm.conf sinfo
    python3 cluster/slurm/localcluster.py down     # or: make slurm-down

Each compute node is a host of its own, as in notebook 14: a network, UTS and mount namespace
(its own interface ``eth0``, address, ports, hostname ``n1``/``n2`` and an /etc/hosts naming
both), joined to this machine by a bridge. ``slurmctld`` runs on this machine on the bridge's
address, one ``slurmd`` runs inside each node, pinned to its own share of the cores (taskset).
They use Debian's slurm-wlm 22.05 and munge (installed with apt when missing, as root), with
their own config, spool, logs and munge key under ``cluster/slurm/local/`` (git-ignored): never
the system's /etc/slurm or /etc/munge.
No cgroups: ``proctrack/linuxproc`` finds a job's processes by their parents.

``up`` starts whatever is not running yet (idempotent: run it again after ``kill-node``);
``down`` ends every daemon and every process on the nodes, removes the namespaces, the bridge
and the ports; ``kill-node n2`` pulls a node's plug (its slurmd and every process on it, with
SIGKILL); ``status`` says what runs. Standard library only: it runs before the kit's venv.

Why these choices (measured on Debian 12, 2 cores):
- ``unshare`` + ``nsenter``, not ``ip netns exec``: slurmd would not start under the latter.
- SlurmdTimeout 300 s by default: a dead node went unnoticed for five minutes. Here 6 s.
- ``sbatch`` refuses any GPU request on these CPU nodes: the template's CPU form has none.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
KIT = Path(os.environ.get("MULTIGPU_LAB_SLURM_DIR", HERE / "local")).resolve()
CONF = KIT / "etc" / "slurm.conf"
NODES = ("n1", "n2")
SUBNET = "10.78.0"  # node i gets .i, the controller .254; private to this machine
CTLD_ADDR = f"{SUBNET}.254"
BRIDGE = "mglslurm0"
CTLD_PORT = 16817  # not Slurm's default 6817: never the port of a real controller
SLURMD_PORT = 6818  # each node has its own network namespace, hence its own ports
PACKAGES = ("slurm-wlm", "munge")
TOOLS = ("slurmctld", "slurmd", "sinfo", "sbatch", "munged", "unshare", "nsenter", "ip")
SYSTEM_CONFS = (Path("/etc/slurm/slurm.conf"), Path("/etc/slurm-llnl/slurm.conf"))
UP = ("idle", "allocated", "mixed", "completing")  # sinfo's states of a node that answers
MARK = "mgl-slurm-node"  # in each node's holder process: sh -c ... mgl-slurm-node:<kit>:<node>


class Refused(RuntimeError):
    """The cluster cannot be made here; the message says why and what would fix it."""


def say(text: str) -> None:
    print(text, flush=True)


def run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=check)


# ------------------------------------------------------------------ what is running


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def holders() -> dict[str, int]:
    """Each node's namespace holder: the process that keeps its namespaces alive."""
    found = {}
    for pid in _pids():
        args = _cmdline(pid)
        if args and args[-1].startswith(f"{MARK}:{KIT}:") and _alive(pid):
            found[args[-1].rsplit(":", 1)[1]] = pid
    return found


def on_node(node: str) -> list[int]:
    """Every process running on a node (in its network namespace), its holder included."""
    holder = holders().get(node)
    if holder is None:
        return []
    ns = _netns(holder)
    return [p for p in _pids() if _netns(p) == ns and _alive(p)]


def daemons() -> dict[str, list[int]]:
    """This kit's daemons by name: munged, slurmctld and each node's slurmd."""
    found: dict[str, list[int]] = {}
    for pid in _pids():
        args = _cmdline(pid)
        if not args or not _alive(pid) or not any(str(KIT) in a for a in args):
            continue
        name = Path(args[0]).name
        if name in ("munged", "slurmctld"):
            found.setdefault(name, []).append(pid)
        elif name == "slurmd":
            node = args[args.index("-N") + 1] if "-N" in args else "?"
            found.setdefault(f"slurmd {node}", []).append(pid)
    return found


def _end(pids: list[int], grace: float = 3.0) -> None:
    """SIGTERM, a moment's grace, then SIGKILL for whatever still runs."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        pids = [p for p in pids if _alive(p)]
        if not pids:
            return


# ------------------------------------------------------------------ checks and installation


def refusal() -> str | None:
    """Why this machine cannot run the local cluster, or None when it can (after installing)."""
    if not sys.platform.startswith("linux"):
        return f"the local Slurm cluster needs Linux namespaces; this is {sys.platform}"
    if os.geteuid() != 0:
        return (
            "the local Slurm cluster needs root (daemons, namespaces, a bridge): "
            "run it as root, e.g. in CI or a container started with --privileged"
        )
    for conf in SYSTEM_CONFS:
        if conf.exists():
            return (
                f"a Slurm is already configured here ({conf}): use it (`sinfo`) rather than "
                "a second one; the kit never touches the system's Slurm"
            )
    conf = os.environ.get("SLURM_CONF")
    if conf and Path(conf).resolve() != CONF:
        return f"SLURM_CONF points at another Slurm ({conf}): unset it or use that one"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing and shutil.which("apt-get") is None:
        return (
            f"{', '.join(missing)} missing and no apt-get to install Debian's "
            f"{' '.join(PACKAGES)}: install Slurm 22.05+ and munge by hand"
        )
    return None


def install() -> None:
    """Debian's slurm-wlm and munge (and iproute2), without starting their system services."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if not missing:
        return
    packages = [*PACKAGES, *(["iproute2"] if "ip" in missing else [])]
    say(f"installing {' '.join(packages)} (missing: {', '.join(missing)})")
    # Debian starts a package's service on install unless policy-rc.d says no: the system's
    # munged and slurmd must not run beside the kit's (a container image usually has it).
    policy = Path("/usr/sbin/policy-rc.d")
    added = not policy.exists()
    if added:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        for argv in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        ):
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise Refused(f"`{' '.join(argv)}` failed: {(done.stdout + done.stderr)[-800:]}")
    finally:
        if added:
            policy.unlink()


# ------------------------------------------------------------------ configuration


def cpus_per_node() -> int:
    return max(1, len(os.sched_getaffinity(0)) // len(NODES))


def cores_of(index: int) -> str:
    """The cores node ``index`` (1, 2, ...) runs on, for taskset: each node its own share of
    this machine, as separate machines have, so a job sizing its threads by the cores it sees
    (scripts/ddp_train.py does) does not oversubscribe the machine with two nodes' threads."""
    cores = sorted(os.sched_getaffinity(0))
    share = cpus_per_node()
    mine = cores[(index - 1) * share : index * share] or cores[:share]
    return ",".join(map(str, mine))


def slurm_conf() -> str:
    """The cluster's slurm.conf: every path under the kit, failures noticed in seconds."""
    k, cpus = KIT, cpus_per_node()
    nodes = "".join(
        f"NodeName={n} NodeAddr={SUBNET}.{i} Port={SLURMD_PORT} CPUs={cpus} State=UNKNOWN\n"
        for i, n in enumerate(NODES, start=1)
    )
    return f"""\
# Written by cluster/slurm/localcluster.py (Multi-GPU Lab): two nodes on one machine.
ClusterName=mgl-local
SlurmctldHost={socket.gethostname().split(".")[0]}({CTLD_ADDR})
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={k}/munge/munge.socket,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation={k}/state
SlurmdSpoolDir={k}/nodes/%n
SlurmctldPidFile={k}/run/slurmctld.pid
SlurmdPidFile={k}/run/slurmd-%n.pid
SlurmctldLogFile={k}/log/slurmctld.log
SlurmdLogFile={k}/log/slurmd-%n.log
PlugStackConfig={k}/etc/plugstack.conf
# No cgroups: a job's processes are found by their parents, and not confined.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
ReturnToService=2
# A job that can never run (more nodes than exist) is refused at submission, not left pending.
EnforcePartLimits=ALL
# Seconds, not minutes: a node that stops answering is DOWN after SlurmdTimeout, a cancelled
# job's processes get SIGKILL KillWait after SIGTERM.
SlurmdTimeout=6
SlurmctldTimeout=10
MessageTimeout=4
KillWait=3
InactiveLimit=0
MinJobAge=600
{nodes}PartitionName=local Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def hosts_file() -> str:
    """The nodes' /etc/hosts: both nodes and the controller, as a cluster's DNS would say."""
    lines = ["127.0.0.1 localhost"]
    for i, n in enumerate(NODES, start=1):  # IPv4-mapped too: c10d looks peers up both ways
        lines += [f"{SUBNET}.{i} {n}", f"::ffff:{SUBNET}.{i} {n}"]
    lines.append(f"{CTLD_ADDR} {socket.gethostname().split('.')[0]} slurmctld")
    return "\n".join(lines) + "\n"


def write_config() -> None:
    for sub in ("etc", "munge", "state", "run", "log", *(f"nodes/{n}" for n in NODES)):
        (KIT / sub).mkdir(parents=True, exist_ok=True)
    (KIT / "munge").chmod(0o700)
    CONF.write_text(slurm_conf())
    (KIT / "etc" / "plugstack.conf").write_text("")
    (KIT / "etc" / "hosts").write_text(hosts_file())
    key = KIT / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o400)


# ------------------------------------------------------------------ bringing it up


def start_munge() -> None:
    m = KIT / "munge"
    run(
        "munged",
        f"--key-file={m}/munge.key",
        f"--socket={m}/munge.socket",
        f"--pid-file={m}/munged.pid",
        f"--log-file={KIT}/log/munged.log",
        f"--seed-file={m}/munged.seed",
        "--force",  # munged as root, in a folder it did not make
    )


def start_bridge() -> None:
    if run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{CTLD_ADDR}/24", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")


def start_node(index: int, node: str) -> None:
    """The node's namespaces (held by a sleeping shell), its cable to the bridge, its slurmd."""
    holder = holders().get(node)
    if holder is None:
        ready = KIT / "run" / f"{node}.ready"
        ready.unlink(missing_ok=True)
        # The shell itself holds the namespaces, blocked reading a FIFO nobody writes to (no
        # child process on the node); its last argument names it for `down`.
        hold = KIT / "run" / f"{node}.hold"
        hold.unlink(missing_ok=True)
        os.mkfifo(hold)
        script = (
            f"hostname {node} && mount --bind {KIT}/etc/hosts /etc/hosts && touch {ready} "
            f"&& exec 3<>{hold} && read -r _ <&3"
        )
        # Not `ip netns exec`: slurmd would not start under it; unshare + nsenter work.
        proc = subprocess.Popen(
            ["unshare", "--net", "--uts", "--mount", "--propagation", "private"]
            + ["sh", "-c", script, f"{MARK}:{KIT}:{node}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise Refused(f"could not make node {node}'s namespaces (unshare)")
            time.sleep(0.02)
        holder = proc.pid
        cable = f"mglsl-{node}"
        run("ip", "link", "del", cable, check=False)  # a leftover of a killed run
        run(
            "ip", "link", "add", cable, "type", "veth", "peer", "name", "eth0", "netns", str(holder)
        )
        run("ip", "link", "set", cable, "master", BRIDGE, "up")
        inside = ("nsenter", "-t", str(holder), "-n")
        run(*inside, "ip", "addr", "add", f"{SUBNET}.{index}/24", "dev", "eth0")
        run(*inside, "ip", "link", "set", "eth0", "up")
        run(*inside, "ip", "link", "set", "lo", "up")
    if f"slurmd {node}" not in daemons():
        inside = ("nsenter", "-t", str(holder), "-n", "-u", "-m")
        run(*inside, "taskset", "-c", cores_of(index), "slurmd", "-f", str(CONF), "-N", node)


def sinfo(timeout: float = 10) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sinfo", "-N", "-o", "%N %T %c %P"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "SLURM_CONF": str(CONF)},
    )


def wait_up(timeout: float = 60) -> str:
    """Until sinfo shows every node up (idle, or running a job that was waiting for it)."""
    deadline = time.monotonic() + timeout
    shown = ""
    while time.monotonic() < deadline:
        out = sinfo()
        shown = out.stdout + out.stderr
        states = [line.split()[1] for line in out.stdout.splitlines()[1:] if line.split()]
        if out.returncode == 0 and len(states) == len(NODES) and all(s in UP for s in states):
            return out.stdout
        time.sleep(0.3)
    raise Refused(f"the nodes did not come up within {timeout:.0f} s:\n{shown}")


def up() -> None:
    reason = refusal()
    if reason:
        raise Refused(reason)
    start = time.monotonic()
    install()
    write_config()
    running = daemons()
    if "munged" not in running:
        start_munge()
    start_bridge()
    if "slurmctld" not in running:
        (KIT / "log" / "slurmctld.log").unlink(missing_ok=True)
        run("slurmctld", "-f", str(CONF), "-c")  # -c: a fresh start, no jobs from a past run
    for index, node in enumerate(NODES, start=1):
        start_node(index, node)
    shown = wait_up()
    say(shown.rstrip())
    say(f"local Slurm cluster up in {time.monotonic() - start:.1f} s; its commands need")
    say(f"  export SLURM_CONF={CONF}")


# ------------------------------------------------------------------ taking it down


def kill_node(node: str) -> list[int]:
    """Pull the plug: SIGKILL the node's slurmd and every process on it (not its namespaces)."""
    holder = holders().get(node)
    victims = [p for p in on_node(node) if p != holder]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return victims


def down() -> list[str]:
    """End everything `up` started; what was found is returned (and printed)."""
    ended = []
    for node in NODES:
        procs = on_node(node)
        if procs:
            _end(procs)
            ended.append(f"node {node}: {len(procs)} processes")
    for name, pids in sorted(daemons().items()):
        _end(pids)
        ended.append(f"{name} ({', '.join(map(str, pids))})")
    if shutil.which("ip"):
        for link in [f"mglsl-{n}" for n in NODES] + [BRIDGE]:
            if run("ip", "link", "show", link, check=False).returncode == 0:
                run("ip", "link", "del", link, check=False)
                ended.append(f"link {link}")
    for pidfile in (KIT / "run").glob("*") if (KIT / "run").exists() else []:
        pidfile.unlink(missing_ok=True)
    (KIT / "munge" / "munge.socket").unlink(missing_ok=True)
    CONF.unlink(missing_ok=True)  # `up` writes it again; meanwhile nothing takes it for a cluster
    say("local Slurm cluster down: " + ("; ".join(ended) if ended else "nothing was running"))
    return ended


def status() -> int:
    running = daemons()
    nodes = {n: len(on_node(n)) for n in NODES}
    say(f"daemons: {running or 'none'}; processes on the nodes: {nodes}")
    if "slurmctld" in running:
        out = sinfo()
        say((out.stdout + out.stderr).rstrip())
    return 0 if running else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "down", "status", "env"):
        sub.add_parser(name)
    kill = sub.add_parser("kill-node", help="SIGKILL a node's slurmd and all its processes")
    kill.add_argument("node", choices=NODES)
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            up()
        elif args.command == "down":
            down()
        elif args.command == "status":
            return status()
        elif args.command == "env":
            print(f"export SLURM_CONF={CONF}")
        else:
            say(f"node {args.node}: killed {kill_node(args.node)}")
    except Refused as exc:
        print(f"localcluster: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"localcluster: `{' '.join(exc.cmd)}` failed: {exc.stderr or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
