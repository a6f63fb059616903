"""Load test of the coordinator's heartbeat endpoint on loopback: many containers, one coordinator.

Starts a real coordinator (its aiohttp server and supervisor, with a job of N
containers whose processes are not launched) in its own process, registers N
simulated containers, then has each of them heartbeat at a fixed interval for
a bounded time from one asyncio client process, and reports heartbeats per
second and latency percentiles. Only 127.0.0.1 is contacted; the run is
bounded by ``--seconds``.

    .venv/bin/python benchmarks/bench_heartbeat.py --containers 1000 --interval 1 --seconds 20

Samza's heartbeat interval is 60 s, so 1,000 containers at 1 s is 60,000
Samza containers' worth of heartbeats.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from spark_elastic.runtime.coordinator.server import CoordinatorServer, bind
from spark_elastic.runtime.coordinator.stores import SQLiteStore
from spark_elastic.runtime.coordinator.supervisor import JobShape, Supervisor
from spark_elastic.runtime.lease import LeaseTerms


class NoProcesses:
    """A launcher for simulated containers: nothing is started; every 'process' is alive."""

    def launch(self, container_id: str, env: Mapping[str, str]) -> str:
        return f"simulated-{container_id}"

    def alive(self, handle: str, container_id: str) -> bool:
        return True

    def terminate(self, handle: str, container_id: str) -> None:
        return None

    def kill(self, handle: str, container_id: str, sig: int) -> None:
        return None

    def reap(self) -> None:
        return None


def serve(containers: int, root: str, port_out: multiprocessing.SimpleQueue) -> None:  # type: ignore[type-arg]
    tasks = tuple(f"Partition {p}" for p in range(containers))
    shape = JobShape("bench", "bench:job", 1, {"load": containers}, tasks, f"{root}/cp")
    store = SQLiteStore(Path(root) / "coordinator.db")
    terms = LeaseTerms(lease_s=10.0, margin_s=5.0, write_budget_s=3.0)
    server = CoordinatorServer(
        lambda url: Supervisor(shape, store, NoProcesses(), url, containers, terms, startup_s=3600),
        bind("127.0.0.1", 0),
    )
    server.run_forever(lambda: port_out.put(server.url))


async def container(
    session: aiohttp.ClientSession,
    url: str,
    cid: str,
    interval: float,
    until: float,
    latencies: list[float],
    failures: list[int],
) -> None:
    await asyncio.sleep(random.random() * interval)  # spread the phases, as real containers are
    heartbeat = f"{url}/containerHeartbeat?executionContainerId={cid}"
    while True:
        started = time.perf_counter()
        if started >= until:
            return
        try:
            async with session.get(heartbeat) as response:
                body = await response.json()
                if response.status != 200 or not body.get("alive"):
                    failures.append(1)
        except aiohttp.ClientError:
            failures.append(1)
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(max(0.0, interval - (time.perf_counter() - started)))


async def load(url: str, containers: int, interval: float, seconds: float) -> None:
    connector = aiohttp.TCPConnector(limit=containers)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for i in range(containers):
            async with session.post(
                f"{url}/containers/register", json={"containerId": f"bench-c{i + 1}", "pid": 0}
            ) as response:
                assert (await response.json())["alive"]
        latencies: list[float] = []
        failures: list[int] = []
        started = time.perf_counter()
        until = started + seconds
        await asyncio.gather(
            *(
                container(session, url, f"bench-c{i + 1}", interval, until, latencies, failures)
                for i in range(containers)
            )
        )
        elapsed = time.perf_counter() - started
    ordered = sorted(latencies)

    def p(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    print(
        f"{containers} containers, {interval:g} s interval, {seconds:g} s: "
        f"{len(latencies)} heartbeats, {len(latencies) / elapsed:,.0f}/s, "
        f"p50 {p(0.50):.1f} ms, p99 {p(0.99):.1f} ms, max {ordered[-1] * 1000:.1f} ms, "
        f"mean {statistics.fmean(latencies) * 1000:.1f} ms, failures {len(failures)}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    if not 0 < args.seconds <= 120:
        parser.error("--seconds must be in (0, 120]: the load test is bounded")
    with tempfile.TemporaryDirectory() as root:
        port_out: multiprocessing.SimpleQueue = multiprocessing.SimpleQueue()  # type: ignore[type-arg]
        server = multiprocessing.Process(target=serve, args=(args.containers, root, port_out))
        server.start()
        try:
            url = port_out.get()
            asyncio.run(load(url, args.containers, args.interval, args.seconds))
        finally:
            server.terminate()
            server.join(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
