"""Containers as hosts of their own on one machine: Linux namespaces on a bridge.

:class:`NamespaceLauncher` runs each container in its own network, mount,
UTS and PID namespaces (``ip netns`` and ``unshare``, as root): an address
of its own on a bridge (:class:`Bridge`), its own hostname, its own process
table, and the directories the launcher hides (the job's checkpoint root
on the local disk, say) covered by an empty ``tmpfs``, so nothing can
quietly use a disk it would not share with another host. It reaches the
coordinator, the Kafka broker, HDFS or S3 only over the bridge. So a job
runs across "hosts" on one machine, and the faults of a real network can be
made on it: a partition is the container's link set down
(:meth:`NamespaceLauncher.cut`), a pause is SIGSTOP.

A container's handle is its network namespace's name; the launcher finds
its processes there, by the container id in their environment, so a new
launcher (a restarted coordinator, a standby that took over) answers for
namespaces an earlier one made. A namespace is removed once nothing of its
container runs in it (:meth:`NamespaceLauncher.reap`).

Runs in the coordinator process, on its event loop; ``ip`` calls take a
few milliseconds each.

May import: :mod:`.local` (the PID checks), :mod:`spark_elastic.runtime.protocol`,
:mod:`spark_elastic.errors` and the standard library.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spark_elastic.errors import ArgumentError, SparkElasticError
from spark_elastic.runtime.coordinator.launchers.local import of_container

__all__ = ["Bridge", "NamespaceError", "NamespaceLauncher"]

IP_TIMEOUT_S = 10.0
"""The longest one ``ip`` call may take."""

KILL_WAIT_S = 1.0
"""How long a SIGKILL is given to end a container before its namespace is looked at."""


class NamespaceError(SparkElasticError):
    """An ``ip`` call the namespace launcher needs failed (not root, say); one line why."""


def ip(*args: str, check: bool = True, net: str | None = None) -> str:
    """Run ``ip ARGS`` (iproute2), in the named network namespace ``net`` if given (a
    bridge's, from a coordinator on a host of its own); its output, or
    :class:`NamespaceError` in one line."""
    where = ("-n", net) if net else ()
    try:
        done = subprocess.run(
            ["ip", *where, *args],
            capture_output=True,
            text=True,
            timeout=IP_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NamespaceError(f"ip {' '.join(args)}: {exc}") from None
    if check and done.returncode != 0:
        raise NamespaceError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _mac_of(name: str) -> str:
    """A locally administered unicast MAC address of the bridge's own, from its name."""
    digest = hashlib.sha256(name.encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))


def _first_of_its_namespace(pid: int) -> bool:
    """Whether process ``pid`` is PID 1 of a PID namespace of its own (a container's main)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                ids = line.split()[1:]
                return len(ids) > 1 and ids[-1] == "1"
    return False


@dataclass(frozen=True)
class Bridge:
    """A Linux bridge the containers' links join: their network, and the coordinator's side.

    Attributes
    ----------
    name
        The bridge's interface name (at most 15 characters).
    network
        Its IPv4 network; the first address is the bridge's own (the
        coordinator and the servers listen there), the others are handed to
        containers.
    """

    name: str
    network: ipaddress.IPv4Network
    netns: str | None = None
    """The named network namespace the bridge is in, when this process runs in another (a
    coordinator on a host of its own); None: this process's own."""

    @property
    def pin(self) -> str:
        """The name under which the bridge's network namespace is kept in ``/run/netns``, so
        that a process in another (a standby coordinator's) reaches the bridge there."""
        return f"{self.name}_net"

    @classmethod
    def create(cls, name: str, network: str) -> Bridge:
        """Make the bridge (or take it as it is, if it exists with this address) and bring it up.

        Made from the network it is in, the bridge's network namespace is also
        kept by name (:attr:`pin`); from a network namespace of its own that has
        not got the bridge, a process takes the bridge in that pinned one.

        Raises
        ------
        ArgumentError
            ``name`` is too long for an interface, or ``network`` not an IPv4 network.
        NamespaceError
            ``ip`` refused (not root, say).
        """
        if not 0 < len(name) <= 15:
            raise ArgumentError.invalid("name", "an interface name of 1 to 15 characters", name)
        try:
            net = ipaddress.IPv4Network(network)
        except ValueError:
            raise ArgumentError.invalid(
                "network", "an IPv4 network like 10.77.0.0/24", network
            ) from None
        bridge = cls(name, net)
        here = bool(ip("link", "show", "dev", name, check=False).strip())
        pinned = Path("/run/netns", bridge.pin).exists()
        if not here and pinned and ip("link", "show", "dev", name, check=False, net=bridge.pin):
            return cls(name, net, bridge.pin)  # on a host of its own: the bridge is there
        if not here:
            # An address of its own, set: a bridge otherwise takes the lowest of its ports',
            # and changes it when that port goes (a container's namespace removed), while the
            # others' neighbour caches still send the coordinator's packets to the old one.
            ip("link", "add", name, "address", _mac_of(name), "type", "bridge")
        if f"inet {bridge.gateway}/" not in ip("-4", "addr", "show", "dev", name):
            ip("addr", "add", f"{bridge.gateway}/{net.prefixlen}", "dev", name)
        ip("link", "set", name, "up")
        if not pinned:
            ip("netns", "attach", bridge.pin, str(os.getpid()))
        return bridge

    @property
    def gateway(self) -> str:
        """The bridge's own address: where containers reach the coordinator and the servers."""
        return str(self.network.network_address + 1)

    def address(self, number: int) -> str:
        """The address of host ``number`` (2 and up) on the bridge."""
        return str(self.network.network_address + number)

    def own_numbers(self) -> list[int]:
        """The host numbers of the bridge's own addresses in its network (its first, and any
        added: a standby coordinator's), which no container is given."""
        shown = ip("-4", "-o", "addr", "show", "dev", self.name, check=False, net=self.netns)
        numbers = []
        for word in shown.split():
            address = word.split("/")[0]
            with contextlib.suppress(ValueError):
                if ipaddress.IPv4Address(address) in self.network:
                    numbers.append(
                        int(ipaddress.IPv4Address(address)) - int(self.network.network_address)
                    )
        return numbers

    def add_address(self, address: str) -> None:
        """Give the bridge another address of its network (a standby coordinator's), if it
        has not got it yet; a launcher skips the bridge's addresses as it numbers containers.

        Raises
        ------
        ArgumentError
            ``address`` is not in the bridge's network.
        """
        if ipaddress.IPv4Address(address) not in self.network:
            raise ArgumentError.invalid("address", f"an address of {self.network}", address)
        if f"inet {address}/" not in ip("-4", "addr", "show", "dev", self.name, net=self.netns):
            ip(
                "addr",
                "add",
                f"{address}/{self.network.prefixlen}",
                "dev",
                self.name,
                net=self.netns,
            )

    def delete(self) -> None:
        """Remove the bridge (the containers' links on it go with their namespaces) and the
        name its network namespace was kept under (the namespace itself lives on)."""
        ip("link", "del", self.name, check=False, net=self.netns)
        ip("netns", "del", self.pin, check=False)


@dataclass
class NamespaceLauncher:
    """Each container a host of its own on this machine (see the module's docstring).

    Attributes
    ----------
    bridge
        The network the containers join.
    log_dir
        Where container logs go (on the coordinator's host).
    prefix
        Names of this launcher's namespaces (``<prefix>-<n>``) and links
        (``<prefix>v<n>``); short, and unique on the machine.
    hidden
        Directories not mounted in a container's namespace: an empty tmpfs
        covers each (a job's checkpoint root on the local disk, its log).
    reserved
        Addresses of the bridge's network never given to a container: the
        coordinators' (a standby's on a host of its own is not the bridge's).
    command
        The container command (default: this interpreter running
        ``spark_elastic container run``).
    env
        Extra environment for every container.
    """

    bridge: Bridge
    log_dir: Path
    prefix: str = "se"
    hidden: Sequence[Path] = ()
    reserved: Sequence[str] = ()
    command: Sequence[str] = (sys.executable, "-m", "spark_elastic", "container", "run")
    env: Mapping[str, str] = field(default_factory=dict)
    _children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _last: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0 < len(self.prefix) <= 8 or not self.prefix.isalnum():
            raise ArgumentError.invalid("prefix", "1 to 8 letters or digits", self.prefix)

    # names

    def namespaces(self) -> list[str]:
        """This launcher's namespaces on the machine (its own and an earlier launcher's)."""
        names = [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]
        return sorted(n for n in names if n.startswith(f"{self.prefix}-"))

    def _number(self, handle: str) -> int | None:
        head, _, number = handle.rpartition("-")
        return int(number) if head == self.prefix and number.isdigit() else None

    def link_of(self, handle: str) -> str:
        """The host side of a container's link on the bridge (``ip link set ... down`` cuts it)."""
        number = self._number(handle)
        if number is None:
            raise ArgumentError.invalid("handle", f"a namespace {self.prefix}-N", handle)
        return f"{self.prefix}v{number}"

    def address_of(self, handle: str) -> str:
        """A container's address on the bridge."""
        number = self._number(handle)
        if number is None:
            raise ArgumentError.invalid("handle", f"a namespace {self.prefix}-N", handle)
        return self.bridge.address(number)

    # Launcher

    def launch(self, container_id: str, env: Mapping[str, str]) -> str:
        """Make a namespace with an address on the bridge and start the container in it;
        returns the namespace's name."""
        number = self._next_number()
        handle, link = f"{self.prefix}-{number}", f"{self.prefix}v{number}"
        address = self.bridge.address(number)
        ip("netns", "add", handle)
        try:
            net = self.bridge.netns
            ip(
                "link",
                "add",
                link,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                handle,
                net=net,
            )
            ip("link", "set", link, "master", self.bridge.name, "up", net=net)
            prefixlen = str(self.bridge.network.prefixlen)
            ip("-n", handle, "addr", "add", f"{address}/{prefixlen}", "dev", "eth0")
            ip("-n", handle, "link", "set", "eth0", "up")
            ip("-n", handle, "link", "set", "lo", "up")
            ip("-n", handle, "route", "add", "default", "via", self.bridge.gateway)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with (self.log_dir / f"{container_id}.log").open("ab") as log:
                process = subprocess.Popen(
                    ["ip", "netns", "exec", handle, *self._inside(container_id, address)],
                    # Spark's driver binds and names itself by this host's address.
                    env={
                        **os.environ,
                        **self.env,
                        **env,
                        "SPARK_LOCAL_IP": address,
                        "SPARK_LOCAL_HOSTNAME": address,
                    },
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except BaseException:
            ip("netns", "del", handle, check=False)
            raise
        self._children[handle] = process
        return handle

    def _next_number(self) -> int:
        """The next free host number after the last one handed out, so a name (and an
        address) is not given again while the bridge has others free."""
        taken = {self._number(n) for n in self.namespaces()}
        # And the bridge's own addresses (a standby coordinator's, say) and the coordinators':
        # never a container's.
        taken |= set(self.bridge.own_numbers())
        taken |= {
            int(ipaddress.IPv4Address(a)) - int(self.bridge.network.network_address)
            for a in self.reserved
        }
        hosts = range(2, self.bridge.network.num_addresses - 1)
        if self._last is None:
            self._last = max((n for n in taken if n is not None), default=1)
        ordered = [n for n in hosts if n > self._last] + [n for n in hosts if n <= self._last]
        free = next((n for n in ordered if n not in taken), None)
        if free is None:
            raise NamespaceError(f"no address left on {self.bridge.name} ({self.bridge.network})")
        self._last = free
        return free

    def _files_of(self, container_id: str, address: str) -> Path:
        """The container's own ``hosts`` and (empty) ``resolv.conf``, beside its log."""
        folder = self.log_dir / f"{container_id}.etc"
        folder.mkdir(parents=True, exist_ok=True)
        hosts = f"127.0.0.1 localhost\n{address} {container_id[:63]}\n"
        (folder / "hosts").write_text(hosts)
        (folder / "resolv.conf").write_text("")
        return folder

    def _inside(self, container_id: str, address: str) -> list[str]:
        """The command that makes the container's mount, UTS and PID namespaces and runs it.

        ``unshare --kill-child`` ends the container with it if it is killed.
        """
        covers = "".join(
            f"mount -t tmpfs -o size=1m tmpfs {shlex.quote(str(d))}; " for d in self.hidden
        )
        # Its own name resolves to its own address, and nothing waits for a name server the
        # bridge cannot reach (the JVM looks its host name up as it starts).
        name = shlex.quote(container_id[:63])
        files = shlex.quote(str(self._files_of(container_id, address)))
        script = (  # the files first: a hidden directory may hold them
            f"set -e; mount --bind {files}/hosts /etc/hosts; "
            f"mount --bind {files}/resolv.conf /etc/resolv.conf; {covers}hostname {name}; "
            'exec "$@"'
        )
        return [
            *("unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc"),
            *("--kill-child=SIGTERM", "sh", "-c", script, "sh", *self.command),
        ]

    def pids(self, handle: str, container_id: str) -> list[int]:
        """The live processes of that container in the namespace ``handle``."""
        if self._number(handle) is None:
            return []
        listed = ip("netns", "pids", handle, check=False).split()
        return [int(p) for p in listed if p.isdigit() and of_container(int(p), container_id)]

    def alive(self, handle: str, container_id: str) -> bool:
        """Whether a process of that container runs in the namespace ``handle``."""
        child = self._children.get(handle)
        if child is not None:
            return child.poll() is None
        return bool(self.pids(handle, container_id))

    def reaches(self, handle: str) -> bool:
        """Whether the launcher reaches the container's host: not while it is cut off.

        A launcher on another host signals a container over the network, so
        a partition keeps it from stopping or killing it as well; here the
        processes are on this machine, and this says what a real one could.
        """
        number = self._number(handle)
        if number is None:
            return False
        # Asked of `ip` in the bridge's network (a coordinator in a namespace of its own
        # sees its own interfaces in /sys).
        link = f"{self.prefix}v{number}"
        shown = ip("-o", "link", "show", "dev", link, check=False, net=self.bridge.netns)
        if "<" not in shown:
            return True  # its link is gone with its namespace: nothing left to reach
        return "UP" in shown.split("<", 1)[1].split(">", 1)[0].split(",")

    def terminate(self, handle: str, container_id: str) -> None:
        """SIGTERM to the container's main process: it finishes its micro-batch in flight.

        That process is the first of its PID namespace (``unshare``, its parent here,
        ignores SIGTERM while it waits for it).
        """
        if not self.reaches(handle):
            return
        for pid in self.pids(handle, container_id):
            if _first_of_its_namespace(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)

    def kill(self, handle: str, container_id: str, sig: int) -> None:
        """Signal every process of that container in the namespace (its JVM too), when its
        host is in reach."""
        if not self.reaches(handle):
            return
        for pid in self.pids(handle, container_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        child = self._children.get(handle)
        if sig == signal.SIGKILL and child is not None:
            # Its namespace goes with it now, not at a tick: a job's stop kills last.
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(KILL_WAIT_S)
            self.reap()

    def reap(self) -> None:
        """Collect exited containers and remove their namespaces (and their links)."""
        for handle, child in list(self._children.items()):
            if child.poll() is not None and not ip("netns", "pids", handle, check=False).split():
                ip("netns", "del", handle, check=False)
                del self._children[handle]

    # faults and cleanup

    def cut(self, handle: str) -> None:
        """Partition the container from the network: its link on the bridge goes down."""
        ip("link", "set", self.link_of(handle), "down", net=self.bridge.netns)

    def restore(self, handle: str) -> None:
        """Heal a partition made by :meth:`cut`."""
        ip("link", "set", self.link_of(handle), "up", net=self.bridge.netns)

    def remove_all(self) -> None:
        """SIGKILL everything in this launcher's namespaces and remove them (cleanup)."""
        for handle in self.namespaces():
            for pid in ip("netns", "pids", handle, check=False).split():
                with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            ip("netns", "del", handle, check=False)
        for child in self._children.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(5)
        self._children.clear()
