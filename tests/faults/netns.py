"""A network namespace joined to the host by a veth pair: a link that can be cut.

Processes started with ``prefix`` (``ip netns exec <ns>``) reach the host at
``host_ip`` through the veth; ``down()`` takes the host's end down (packets are lost,
TCP retransmits, nothing is reset), ``up()`` brings it back. Names and the /30 subnet
are derived from this process's id, so concurrent test runs do not collide. Needs root
and ``ip``; ``create`` skips the test otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

import pytest

__all__ = ["VethLink"]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@dataclass
class VethLink:
    """A namespace, a veth pair and the addresses of both ends."""

    ns: str
    host_dev: str
    ns_dev: str
    host_ip: str
    ns_ip: str
    subnet: str

    @property
    def prefix(self) -> tuple[str, ...]:
        """The command prefix that runs a process inside the namespace."""
        return ("ip", "netns", "exec", self.ns)

    @classmethod
    def create(cls) -> VethLink:
        """Make the namespace and the link, or skip the test saying why."""
        if os.geteuid() != 0 or shutil.which("ip") is None:
            pytest.skip("a network namespace needs root and iproute2")
        tag = os.getpid() % 100_000
        used = _ip("-o", "addr", "show", check=False).stdout
        for n in range(64):
            third, fourth = (tag + n) % 250 + 1, ((tag + n) * 4) % 252
            subnet_base = f"10.219.{third}"
            if f"{subnet_base}.{fourth + 1}/" not in used:
                break
        link = cls(
            ns=f"jobsd-faults-{tag}",
            host_dev=f"jf{tag}h",
            ns_dev=f"jf{tag}n",
            host_ip=f"{subnet_base}.{fourth + 1}",
            ns_ip=f"{subnet_base}.{fourth + 2}",
            subnet=f"{subnet_base}.{fourth}/30",
        )
        steps = [
            ("netns", "add", link.ns),
            ("link", "add", link.host_dev, "type", "veth", "peer", "name", link.ns_dev),
            ("link", "set", link.ns_dev, "netns", link.ns),
            ("addr", "add", f"{link.host_ip}/30", "dev", link.host_dev),
            ("link", "set", link.host_dev, "up"),
            ("-n", link.ns, "addr", "add", f"{link.ns_ip}/30", "dev", link.ns_dev),
            ("-n", link.ns, "link", "set", link.ns_dev, "up"),
            ("-n", link.ns, "link", "set", "lo", "up"),
        ]
        for step in steps:
            result = _ip(*step, check=False)
            if result.returncode != 0:
                link.remove()
                pytest.skip(f"cannot set up a veth link (ip {' '.join(step)}): {result.stderr}")
        return link

    def down(self) -> None:
        """Cut the link (the host's end goes down)."""
        _ip("link", "set", self.host_dev, "down")

    def up(self) -> None:
        """Restore the link."""
        _ip("link", "set", self.host_dev, "up")

    def remove(self) -> None:
        """Delete the pair and the namespace (best effort)."""
        _ip("link", "del", self.host_dev, check=False)
        _ip("netns", "del", self.ns, check=False)
