"""Two hosts on one machine: Linux network namespaces joined by a virtual cable (veth).

Why: a multi-node torchrun job is only tested when each agent has its own network stack —
its own interfaces, addresses, ports and loopback — so that the rendezvous endpoint, the
address an agent advertises (``--local-addr``) and the interface the collectives use
(``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``) all have to be right, as on a cluster. A
network namespace is exactly that, for the price of a few ``ip`` commands (iproute2, root).

Everything created here is named ``mgl-<owner pid>-<token>-<n>``, so parallel runs never
collide and namespaces left behind by a killed kernel are recognised (their owner is dead)
and removed by the next run. Teardown ends every process still inside a namespace, then
deletes it; the veth cable goes with it.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers.procs import is_alive

PREFIX = "mgl"  # every namespace this kit creates is called mgl-<pid>-<token>-<n>
NETNS_ETC = Path("/etc/netns")  # `ip netns exec NAME` mounts /etc/netns/NAME/* over /etc
_LIVE: set[TwoHosts] = set()


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made here; the message says why and what would fix it."""


def unavailable_reason() -> str | None:
    """Why two namespaced hosts cannot be made on this machine, or None when they can."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are a Linux feature; this is {sys.platform}"
    if os.geteuid() != 0:
        return (
            "creating network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN); "
            "run as root, e.g. in CI or a container started with --cap-add=SYS_ADMIN,NET_ADMIN"
        )
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed: apt-get install -y iproute2"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run iproute2's ``ip``; a time limit, because a wedged netlink call must not hang a cell."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def list_namespaces() -> list[str]:
    """Names of the network namespaces that exist now (``ip netns list``)."""
    if shutil.which("ip") is None:
        return []
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in(namespace: str) -> list[int]:
    """Processes running inside ``namespace`` (``ip netns pids``)."""
    out = _ip("netns", "pids", namespace, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _owner(namespace: str) -> int | None:
    """The PID in a kit namespace's name (mgl-<pid>-...), or None for anyone else's."""
    parts = namespace.split("-")
    if len(parts) == 4 and parts[0] == PREFIX and parts[1].isdigit():
        return int(parts[1])
    return None


def _delete(namespace: str) -> None:
    """Kill what still runs inside, then delete the namespace (its veth end goes with it)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = pids_in(namespace)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + 3
        while pids and time.monotonic() < deadline and any(is_alive(p) for p in pids):
            time.sleep(0.05)
    _ip("netns", "delete", namespace, check=False)
    shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)
    try:
        NETNS_ETC.rmdir()  # only when empty: other namespaces' files stay
    except OSError:
        pass


def remove_stale() -> list[str]:
    """Delete kit namespaces whose owner process is gone (a kernel killed before teardown)."""
    removed = []
    for name in list_namespaces():
        owner = _owner(name)
        if owner is not None and owner != os.getpid() and not is_alive(owner):
            _delete(name)
            removed.append(name)
    return removed


@dataclass
class Host:
    """One simulated machine: a namespace with loopback and one end of the cable."""

    namespace: str
    hostname: str  # resolvable inside both namespaces through their own /etc/hosts
    address: str
    ifname: str

    @property
    def prefix(self) -> list[str]:
        """Prepend to a command line to run it on this host (nothing for the machine itself)."""
        return ["ip", "netns", "exec", self.namespace] if self.namespace else []

    def run(
        self, argv: list[str], timeout: float = 60, **kwargs: Any
    ) -> subprocess.CompletedProcess:
        """Run a command on this host and wait for it (output captured as text)."""
        return subprocess.run(
            [*self.prefix, *argv], capture_output=True, text=True, timeout=timeout, **kwargs
        )

    def tx_bytes(self) -> int | None:
        """Bytes this host has sent through its end of the cable so far (kernel counters).

        None for a stand-in host on the machine's loopback, whose counters count everyone.
        """
        if not self.namespace:
            return None
        out = _ip("-j", "-s", "-n", self.namespace, "link", "show", "dev", self.ifname).stdout
        return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])


def loopback_hosts(n: int = 2) -> list[Host]:
    """Stand-ins when namespaces cannot be made: n agents on this machine's loopback.

    They are labelled node0, node1 ... like the namespaced hosts, so that output folders and
    records line up; the labels are not resolvable names (every stand-in is 127.0.0.1).
    """
    return [Host("", f"node{i}", "127.0.0.1", "lo") for i in range(n)]


@dataclass(eq=False)  # hashable by identity: live pairs are kept in a set for atexit
class TwoHosts:
    """Two namespaces joined by a veth pair; a context manager that always tears down.

    ``with TwoHosts() as (a, b): ...`` — or ``hosts = TwoHosts().create()`` in a notebook,
    where one ``with`` cannot span cells: ``teardown()`` is then registered with ``atexit``
    and safe to call twice.
    """

    subnet: str = "10.201.0"  # host n gets <subnet>.<n+1>/24; private to these namespaces
    ifname: str = "veth0"  # the same interface name on both hosts, as on uniform cluster nodes
    token: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: list[Host] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)  # every `ip` command run, for the reader

    def _run(self, *args: str) -> None:
        self.commands.append("ip " + " ".join(args))
        try:
            _ip(*args)
        except subprocess.CalledProcessError as exc:
            raise NetnsUnavailable(
                f"`ip {' '.join(args)}` failed: {exc.stderr.strip() or exc}"
            ) from None

    def create(self) -> list[Host]:
        """Make both namespaces, the cable and the addresses; undo everything on failure."""
        reason = unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        remove_stale()
        names = [f"{PREFIX}-{os.getpid()}-{self.token}-{n}" for n in range(2)]
        self.hosts = [
            Host(name, f"node{n}", f"{self.subnet}.{n + 1}", self.ifname)
            for n, name in enumerate(names)
        ]
        _LIVE.add(self)
        try:
            for h in self.hosts:
                self._run("netns", "add", h.namespace)
            a, b = self.hosts
            # Created directly inside the namespaces: the names never exist on this machine.
            self._run(
                "link",
                "add",
                self.ifname,
                "netns",
                a.namespace,
                "type",
                "veth",
                "peer",
                "name",
                self.ifname,
                "netns",
                b.namespace,
            )
            for h in self.hosts:
                self._run("-n", h.namespace, "addr", "add", f"{h.address}/24", "dev", h.ifname)
                self._run("-n", h.namespace, "link", "set", h.ifname, "up")
                self._run("-n", h.namespace, "link", "set", "lo", "up")
            self._write_hosts_files()
            self._wait_until_up()
        except BaseException:
            self.teardown()
            raise
        return self.hosts

    def _wait_until_up(self, timeout: float = 5.0) -> None:
        """The kernel brings a veth end up a moment after both ends are set up; wait for it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = [
                json.loads(_ip("-j", "-n", h.namespace, "link", "show", "dev", h.ifname).stdout)
                for h in self.hosts
            ]
            if all(s[0].get("operstate") == "UP" for s in states):
                return
            time.sleep(0.05)
        raise NetnsUnavailable(f"the veth pair did not come up within {timeout:.0f} s")

    def _write_hosts_files(self) -> None:
        """Give each host an /etc/hosts naming both nodes, as a cluster's DNS would."""
        # Like Debian's own /etc/hosts, the machine's name means loopback: software that
        # trusts gethostname() picks 127.0.1.1, which is why --local-addr and *_SOCKET_IFNAME
        # must name the real interface.
        lines = f"127.0.0.1 localhost\n127.0.1.1 {socket.gethostname()}\n" + "".join(
            f"{h.address} {h.hostname}\n::ffff:{h.address} {h.hostname}\n" for h in self.hosts
        )
        for h in self.hosts:
            try:
                (NETNS_ETC / h.namespace).mkdir(parents=True, exist_ok=True)
                (NETNS_ETC / h.namespace / "hosts").write_text(lines)
            except OSError:
                pass  # names are a convenience; addresses work without them

    def teardown(self) -> list[str]:
        """End every process on both hosts and delete the namespaces (safe to call twice)."""
        removed = []
        for h in self.hosts:
            if h.namespace in list_namespaces() or (NETNS_ETC / h.namespace).exists():
                _delete(h.namespace)
                removed.append(h.namespace)
        _LIVE.discard(self)
        return removed

    def alive(self) -> list[str]:
        """The namespaces of this pair that still exist."""
        present = set(list_namespaces())
        return [h.namespace for h in self.hosts if h.namespace in present]

    def __enter__(self) -> list[Host]:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.teardown()


def _teardown_all() -> None:
    for pair in list(_LIVE):
        pair.teardown()


atexit.register(_teardown_all)
