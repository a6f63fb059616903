"""Load test of the coordinator's container endpoints on loopback: many containers, one coordinator.

Starts a real coordinator (its aiohttp server and supervisor, with a job of N
containers whose processes are not launched) in its own process, on each
store asked for (``--store``: SQLite, a file in a temp directory, and
PostgreSQL, a real server on loopback started by ``tests/postgresql_server.py``,
one fresh database per run, opened with a store lease of 20 s), registers N
simulated containers, then has each of them call it at a fixed interval for a
bounded time from one asyncio client process, and reports requests answered
per second and latency percentiles (from the client: send to reply parsed).

What each simulated container sends (``--loads``):

``heartbeats``
    ``GET /containerHeartbeat`` every ``--interval`` seconds, nothing else.
    A heartbeat renews a lease the coordinator keeps in memory: it does not
    touch the store, so this load measures the HTTP server and the supervisor,
    not the store.
``progress``
    The same heartbeats, plus a progress report (``POST /containers/progress``,
    the body a container sends after each committed micro-batch: its task's
    offsets and lag, the batch's record counts) every ``--batch`` seconds, as
    a busy job with a 1 s trigger sends one per batch. Each report is one
    write transaction of the store (the task's position, the container's
    throughput), on the coordinator's event loop.

Each container starts at a random phase within its interval, as real ones
do. Registrations (one store transaction each) happen before the measured
window and are timed apart. Only 127.0.0.1 is contacted; each run is bounded
by ``--seconds`` and each request by a 10 s timeout; the coordinator is
stopped by its PID after each run and PostgreSQL by its context manager.
CPU is read from ``/proc`` over the measured window, in % of one core.

    .venv/bin/python benchmarks/bench_heartbeat.py
    .venv/bin/python benchmarks/bench_heartbeat.py --store sqlite --loads heartbeats \\
        --containers 1000 --interval 1 --seconds 20

Samza's heartbeat interval is 60 s, so 1,000 containers at 1 s is 60,000
Samza containers' worth of heartbeats.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import random
import resource
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp

from spark_elastic.runtime.coordinator.server import CoordinatorServer, bind
from spark_elastic.runtime.coordinator.stores import open_store
from spark_elastic.runtime.coordinator.supervisor import JobShape, Supervisor
from spark_elastic.runtime.lease import LeaseTerms

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # postgresql_server, kafka_jvm (free_port)

STORES = ("sqlite", "postgresql")
LOADS = ("heartbeats", "progress")
STORE_LEASE_S = 20.0
TOPIC = "load"
RECORDS_PER_BATCH = 100
REQUEST_TIMEOUT_S = 10.0


class NoProcesses:
    """A launcher for simulated containers: nothing is started; every 'process' is alive
    until it is told to stop (so the coordinator's own stop does not wait out its timeout)."""

    def __init__(self) -> None:
        self.stopped: set[str] = set()

    def launch(self, container_id: str, env: Mapping[str, str]) -> str:
        return f"simulated-{container_id}"

    def alive(self, handle: str, container_id: str) -> bool:
        return handle not in self.stopped

    def terminate(self, handle: str, container_id: str) -> None:
        self.stopped.add(handle)

    def kill(self, handle: str, container_id: str, sig: int) -> None:
        self.stopped.add(handle)

    def reap(self) -> None:
        return None


def serve(containers: int, location: str, root: str, url_out: Connection) -> None:
    tasks = tuple(f"Partition {p}" for p in range(containers))
    shape = JobShape("bench", "bench:job", 1, {TOPIC: containers}, tasks, f"{root}/cp")
    store = open_store(location, lease_s=STORE_LEASE_S)
    terms = LeaseTerms(lease_s=10.0, margin_s=5.0, write_budget_s=3.0)
    server = CoordinatorServer(
        lambda url: Supervisor(shape, store, NoProcesses(), url, containers, terms, startup_s=3600),
        bind("127.0.0.1", 0),
    )
    server.run_forever(lambda: url_out.send(server.url))


@dataclass
class Kind:
    """One kind of request's outcomes in the measured window."""

    latencies: list[float] = field(default_factory=list)
    answered: int = 0
    errors: int = 0


@dataclass
class Window:
    """What the simulated containers saw, by kind of request."""

    kinds: dict[str, Kind] = field(default_factory=lambda: {k: Kind() for k in ("hb", "prog")})

    def latencies(self) -> list[float]:
        return sorted(x for k in self.kinds.values() for x in k.latencies)

    @property
    def answered(self) -> int:
        return sum(k.answered for k in self.kinds.values())

    @property
    def errors(self) -> int:
        return sum(k.errors for k in self.kinds.values())


def percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted seconds, in ms (nan for none)."""
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def call(
    session: aiohttp.ClientSession, method: str, url: str, body: Any, kind: Kind
) -> None:
    """One request; its latency (answered or not) and whether it was answered alive."""
    started = time.perf_counter()
    try:
        async with session.request(method, url, json=body) as response:
            reply = await response.json()
            if response.status == 200 and reply.get("alive"):
                kind.answered += 1
            else:
                kind.errors += 1
    except (aiohttp.ClientError, TimeoutError):
        kind.errors += 1
    kind.latencies.append(time.perf_counter() - started)


async def heartbeats(
    session: aiohttp.ClientSession, url: str, cid: str, interval: float, until: float, kind: Kind
) -> None:
    await asyncio.sleep(random.random() * interval)  # spread the phases, as real containers are
    heartbeat = f"{url}/containerHeartbeat?executionContainerId={cid}"
    while (started := time.perf_counter()) < until:
        await call(session, "GET", heartbeat, None, kind)
        # The next one an interval after this one was sent (at once if it took longer); none
        # is slept for past the window, so the rate's time is the window's.
        await asyncio.sleep(max(0.0, min(started + interval, until) - time.perf_counter()))


async def progress(
    session: aiohttp.ClientSession,
    url: str,
    container: Mapping[str, Any],
    batch_s: float,
    until: float,
    kind: Kind,
) -> None:
    """A busy container's progress reports: one per micro-batch, as ``report_commit`` builds."""
    await asyncio.sleep(random.random() * batch_s)
    target = f"{url}/containers/progress"
    batch = 0
    while (started := time.perf_counter()) < until:
        batch += 1
        tasks = [
            {
                "task": t,
                "offsets": {TOPIC: {t.split("_")[0].split()[1]: batch * RECORDS_PER_BATCH}},
                "lag": 0,
            }
            for t in container["tasks"]
        ]
        body = {
            "containerId": container["containerId"],
            "generation": container["generation"],
            "batchId": batch,
            "recordsRead": RECORDS_PER_BATCH,
            "recordsProcessed": RECORDS_PER_BATCH,
            "tasks": tasks,
        }
        await call(session, "POST", target, body, kind)
        await asyncio.sleep(max(0.0, min(started + batch_s, until) - time.perf_counter()))


def cpu_seconds(pids: Iterable[int]) -> float:
    """User plus system CPU of these processes so far (those gone are skipped)."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def process_tree(root: int) -> list[int]:
    """``root`` and its children (a PostgreSQL server and its backends)."""
    found = [root]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == root:
                    found.append(int(entry.name))
    return found


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Run:
    store: str
    load: str
    containers: int
    interval: float
    batch_s: float
    seconds: float

    def sends(self) -> str:
        beat = f"a heartbeat every {self.interval:g} s"
        if self.load == "heartbeats":
            return beat
        return f"{beat} + a progress report every {self.batch_s:g} s"


async def load(url: str, run: Run, coordinator_pid: int, pg_pid: int | None) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=2 * run.containers)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    window = Window()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        began = time.perf_counter()
        for i in range(run.containers):
            async with session.post(
                f"{url}/containers/register", json={"containerId": f"bench-c{i + 1}", "pid": 0}
            ) as response:
                assert (await response.json())["alive"]
        registered_s = time.perf_counter() - began
        async with session.get(f"{url}/jobModel") as response:
            model = await response.json()
        containers = {c["containerId"]: c for c in model["containers"]}
        assert len(containers) == run.containers
        cpu_pids = [coordinator_pid] + ([] if pg_pid is None else process_tree(pg_pid))
        cpu_before = (cpu_seconds([coordinator_pid]), cpu_seconds(cpu_pids[1:]), own_cpu())
        started = time.perf_counter()
        until = started + run.seconds
        calls = [
            heartbeats(session, url, cid, run.interval, until, window.kinds["hb"])
            for cid in containers
        ]
        if run.load == "progress":
            calls += [
                progress(session, url, c, run.batch_s, until, window.kinds["prog"])
                for c in containers.values()
            ]
        await asyncio.gather(*calls)
        elapsed = time.perf_counter() - started
        cpu_after = (cpu_seconds([coordinator_pid]), cpu_seconds(cpu_pids[1:]), own_cpu())
    cpu = [100 * (a - b) / elapsed for a, b in zip(cpu_after, cpu_before, strict=True)]
    ordered = window.latencies()
    hb, prog = window.kinds["hb"], window.kinds["prog"]
    return {
        "run": run,
        "registered_s": registered_s,
        "requests": len(ordered),
        "heartbeats": len(hb.latencies),
        "reports": len(prog.latencies),
        "per_s": window.answered / elapsed,
        "p50": percentile(ordered, 0.50),
        "p99": percentile(ordered, 0.99),
        "max": ordered[-1] * 1000 if ordered else float("nan"),
        "hb_p99": percentile(sorted(hb.latencies), 0.99),
        "prog_p99": percentile(sorted(prog.latencies), 0.99),
        "errors": window.errors,
        "cpu_coordinator": cpu[0],
        "cpu_postgresql": cpu[1] if pg_pid is not None else None,
        "cpu_client": cpu[2],
    }


def one_run(run: Run, location: str, root: str, pg_pid: int | None) -> dict[str, Any]:
    """Start a coordinator on ``location``, load it, and stop it by its PID."""
    url_in, url_out = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.Process(target=serve, args=(run.containers, location, root, url_out))
    server.start()
    try:
        deadline = time.monotonic() + 120
        while not url_in.poll(0.5):
            if not server.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the coordinator on {run.store} did not start")
        url = url_in.recv()
        assert server.pid is not None
        return asyncio.run(load(url, run, server.pid, pg_pid))
    finally:
        server.terminate()
        server.join(30)
        if server.is_alive():
            server.kill()
            server.join(10)


def line(row: dict[str, Any]) -> str:
    run: Run = row["run"]
    reports = f", {row['reports']:,} progress reports" if run.load == "progress" else ""
    pg = "" if row["cpu_postgresql"] is None else f", PostgreSQL {row['cpu_postgresql']:.0f}%"
    return (
        f"{run.store}, {run.containers} containers, {run.sends()}, {run.seconds:g} s: "
        f"registered in {row['registered_s']:.1f} s; {row['requests']:,} requests "
        f"({row['heartbeats']:,} heartbeats{reports}), {row['per_s']:,.0f}/s answered, "
        f"p50 {row['p50']:.1f} ms, p99 {row['p99']:.1f} ms, max {row['max']:.1f} ms, "
        f"heartbeat p99 {row['hb_p99']:.1f} ms"
        + (f", progress p99 {row['prog_p99']:.1f} ms" if run.load == "progress" else "")
        + f", errors {row['errors']}; CPU (% of one core): coordinator "
        f"{row['cpu_coordinator']:.0f}%, client {row['cpu_client']:.0f}%{pg}"
    )


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| store | containers | interval | each container sends | requests/s answered | p50 "
        "| p99 | max | errors | heartbeat p99 | coordinator CPU | PostgreSQL CPU |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        run: Run = row["run"]
        if "failed" in row:
            out.append(
                f"| {run.store} | {run.containers:,} | {run.interval:g} s | {run.sends()} "
                f"| failed: {row['failed']} | | | | | | | |"
            )
            continue
        pg = "-" if row["cpu_postgresql"] is None else f"{row['cpu_postgresql']:.0f}%"
        out.append(
            f"| {run.store} | {run.containers:,} | {run.interval:g} s | {run.sends()} "
            f"| {row['per_s']:,.0f} | {row['p50']:.1f} ms | {row['p99']:.1f} ms "
            f"| {row['max']:.1f} ms | {row['errors']} | {row['hb_p99']:.1f} ms "
            f"| {row['cpu_coordinator']:.0f}% | {pg} |"
        )
    return "\n".join(out)


def names(text: str, known: tuple[str, ...], option: str) -> list[str]:
    chosen = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in known]
    if unknown or not chosen:
        raise SystemExit(f"{option}: expected some of {','.join(known)}, found {text!r}")
    return list(dict.fromkeys(chosen))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=",".join(STORES), help="sqlite,postgresql (both)")
    parser.add_argument("--loads", default=",".join(LOADS), help="heartbeats,progress (both)")
    parser.add_argument("--containers", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=1.0, help="heartbeat interval, s")
    parser.add_argument("--batch", type=float, default=1.0, help="progress report interval, s")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    if not 0 < args.seconds <= 120:
        parser.error("--seconds must be in (0, 120]: the load test is bounded")
    if not 0 < args.containers <= 5000:
        parser.error("--containers must be in (0, 5000]: the load test is bounded")
    if args.interval < 0.1 or args.batch < 0.1:
        parser.error("--interval and --batch must be at least 0.1 s")
    stores = names(args.store, STORES, "--store")
    loads = names(args.loads, LOADS, "--loads")
    print(
        f"bench_heartbeat: {os.cpu_count()} cores; one coordinator process, one client process "
        f"(all simulated containers), loopback; each run {args.seconds:g} s on a fresh store",
        flush=True,
    )
    for name in loads:
        run = Run("", name, args.containers, args.interval, args.batch, args.seconds)
        print(f"  {name}: each container sends {run.sends()}", flush=True)
    rows: list[dict[str, Any]] = []
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        pg = None
        if "postgresql" in stores:
            from postgresql_server import running_postgresql  # type: ignore[import-not-found]

            pg = stack.enter_context(running_postgresql())
            print(
                f"PostgreSQL on 127.0.0.1:{pg.port} (pid {pg.pid}; fsync and synchronous_commit "
                f"off, as the specs run it); store lease {STORE_LEASE_S:g} s",
                flush=True,
            )
        for store in stores:
            for name in loads:
                run = Run(store, name, args.containers, args.interval, args.batch, args.seconds)
                with tempfile.TemporaryDirectory() as root:
                    if store == "postgresql":
                        assert pg is not None
                        location = pg.create_database(f"heartbeat_{len(rows)}")
                    else:
                        location = str(Path(root) / "coordinator.db")
                    try:
                        pg_pid = pg.pid if pg is not None and store == "postgresql" else None
                        row = one_run(run, location, root, pg_pid)
                    except Exception as error:
                        print(f"{store}, {name}: failed: {error}", flush=True)
                        rows.append({"run": run, "failed": str(error)})
                        continue
                rows.append(row)
                print(line(row), flush=True)
    print(f"\n{table(rows)}\n\nrun time {time.monotonic() - began:.0f} s", flush=True)
    return 1 if any("failed" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
