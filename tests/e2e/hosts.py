"""Several "hosts" on one machine: network namespaces on a private bridge, with real latency.

Each host is a network namespace with one veth link to a bridge in a namespace of its
own (the switch); addresses are in 10.213.0.0/24, inside the namespaces only, so nothing
of the machine's own network is touched. ``tc netem`` delays every packet a host sends,
so two hosts see the round trip a rack would give them; on a kernel without netem the
hosts have no added latency, and ``Hosts.no_delay`` says why. Processes run in a host with
``ip netns exec``. Needs root (CAP_NET_ADMIN); :func:`can_build_hosts` says whether it may.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

SUBNET = "10.213.0"


def _ip(*args: str, netns: str | None = None) -> None:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def can_build_hosts() -> str:
    """Why namespaces cannot be built here, or "" when they can."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    if os.geteuid() != 0:
        return "building network namespaces needs root"
    probe = f"blsprobe{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"cannot create a network namespace: {exc.stderr.strip()}"
    _ip("netns", "del", probe)
    return ""


class Hosts:
    """Named hosts: ``hosts.address("w1")``, ``hosts.run("w1", [...])`` prefixes."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.switch = f"bls{tag}sw"
        self.addresses: dict[str, str] = {}
        self.namespaces: dict[str, str] = {}
        self.no_delay = ""  # why no latency could be added, if it could not

    def add(self, name: str, delay_ms: float) -> str:
        index = len(self.addresses) + 2
        netns = f"bls{self.tag}{name}"
        host_if, switch_if = f"h{self.tag}{index}", f"s{self.tag}{index}"
        _ip("netns", "add", netns)
        self.namespaces[name] = netns
        _ip("link", "add", host_if, "type", "veth", "peer", "name", switch_if)
        _ip("link", "set", host_if, "netns", netns)
        _ip("link", "set", switch_if, "netns", self.switch)
        _ip("link", "set", switch_if, "master", "br0", netns=self.switch)
        _ip("link", "set", switch_if, "up", netns=self.switch)
        address = f"{SUBNET}.{index}"
        _ip("addr", "add", f"{address}/24", "dev", host_if, netns=netns)
        _ip("link", "set", host_if, "up", netns=netns)
        _ip("link", "set", "lo", "up", netns=netns)
        if delay_ms and not self.no_delay:
            done = subprocess.run(
                ["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", host_if, "root",
                 "netem", "delay", f"{delay_ms}ms"],
                capture_output=True, text=True,
            )  # fmt: skip
            if done.returncode != 0:  # a kernel without sch_netem: no latency, said so
                self.no_delay = f"tc netem: {done.stderr.strip()}"
        self.addresses[name] = address
        return address

    def address(self, name: str) -> str:
        return self.addresses[name]

    def run(self, name: str) -> list[str]:
        """The command prefix that runs a program on host ``name``."""
        return ["ip", "netns", "exec", self.namespaces[name]]

    def remove(self) -> None:
        for netns in [*self.namespaces.values(), self.switch]:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)


@contextmanager
def hosts(names: list[str], delay_ms: float = 0.5) -> Iterator[Hosts]:
    """Hosts ``names`` on one private switch; each delays what it sends by ``delay_ms``
    (so a round trip between two of them takes twice that)."""
    net = Hosts(uuid.uuid4().hex[:4])
    try:
        _ip("netns", "add", net.switch)
        _ip("link", "add", "br0", "type", "bridge", netns=net.switch)
        _ip("link", "set", "br0", "up", netns=net.switch)
        for name in names:
            net.add(name, delay_ms)
        yield net
    finally:
        net.remove()
