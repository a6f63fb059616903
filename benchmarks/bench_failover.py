"""Coordinator failover: a hot standby on PostgreSQL, against restarting the coordinator by hand.

Real processes on the embedded log, as ``bench_live.py`` runs them: ``spark-elastic
job run`` (a coordinator launching containers, each its own Spark application)
runs the click-count job of ``examples/jobs/click_counts.py`` over 2 partitions
(factor 4, a trigger of 1 s) on 2 containers; once its keyed state holds
``--keys`` keys, a producer keeps about 200 records a second arriving. When the
job is steady (both containers published batches for 20 s), its coordinator is
killed (``SIGKILL``: the containers live on, in sessions of their own), in
three cases side by side:

``standby``
    A PostgreSQL store (a real server on loopback, ``tests/postgresql_server.py``,
    one database per case), two coordinators of the job on two ports, each
    given the other's URL (``--peer``): the second stands by. The defaults:
    store lease 20 s, container lease 10 s, margin 5 s, heartbeat 1 s.
``short``
    The same with shorter leases: ``--store-lease-ms 6000 --lease-ms 4000
    --margin-ms 2000 --write-budget-ms 2000 --heartbeat-ms 500`` (the margin may
    not be below the write budget, whose default is 3 s).
``restart``
    The baseline, what a user does without a standby: one coordinator on the
    default SQLite store, restarted by hand (as systemd or a supervisor would)
    on the same port with the same ``--store`` at once after the kill: a
    restart's best case, on the same host, which a standby does not need.

Measured from the kill: *failover time*, until the new leader's
``/status.json`` (the standby, or the restarted coordinator; polled every
50 ms) shows ``counters.heartbeats_alive > 0``, i.e. it has answered a
container's heartbeat (and when it began to serve: its ``status:`` line);
*the longest output gap*, the longest time in [kill - 10 s, settled + 10 s]
in which no container of the job published a batch with rows (``settled``:
each container has published a batch since the new leader began to serve),
from the output's commit times, with when the containers' last batch before
the new leader and their first batches under it came; the job's micro-batch
interval in the 20 s before the kill (intervals between each container's
published batches); and that the new leader failed no container over once
its wait (one store lease plus the margin) was over: its
``counters.failovers`` is 0 and it runs the same containers. The goal, for a
standby: failover, and the longest gap, within one store lease plus the
margin plus one micro-batch interval (the median before the kill). A case that fails is reported as
failed and the run goes on. Every process started is stopped by its PID at
the end, failed or not (coordinators ``SIGTERM`` then ``SIGKILL``, the
containers seen in their status ``SIGKILL``ed by process group, PostgreSQL by
its context manager).

Run (about 4 minutes; nothing else should load the machine)::

    .venv/bin/python benchmarks/bench_failover.py
    .venv/bin/python benchmarks/bench_failover.py --cases short --keep /tmp/failover
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_live
from bench_live import Trickle, command_line, failed, get_json, job_gap, published, send

from spark_elastic import EmbeddedLog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # postgresql_server, kafka_jvm (free_port)

STEADY_S = 20.0
"""How long the job publishes with the producer running before the kill (and the window its
micro-batch interval is taken from)."""
AROUND_S = 10.0
"""The output gap is looked for from this long before the kill to this long after settling."""
POLL_S = 0.05


@dataclass(frozen=True)
class Case:
    label: str
    postgresql: bool
    options: tuple[str, ...] = ()
    store_lease_s: float = 20.0
    lease_s: float = 10.0
    margin_s: float = 5.0


SHORT = ("--store-lease-ms", "6000", "--lease-ms", "4000", "--margin-ms", "2000")
CASES = {
    "standby": Case("PostgreSQL, hot standby, default leases", True),
    "short": Case(
        "PostgreSQL, hot standby, short leases",
        True,
        (*SHORT, "--write-budget-ms", "2000", "--heartbeat-ms", "500"),
        store_lease_s=6.0,
        lease_s=4.0,
        margin_s=2.0,
    ),
    "restart": Case("SQLite, restarted by hand at once (baseline)", False),
}


def url_of(port: int) -> str:
    return f"http://127.0.0.1:{port}"


class Coordinator(bench_live.RunningJob):
    """One ``spark-elastic job run`` on a given port and store, in a session of its own;
    what it prints on stdout is kept with the time each line came."""

    def __init__(
        self,
        root: Path,
        port: int,
        store: str,
        options: tuple[str, ...],
        peers: tuple[str, ...],
        name: str,
    ) -> None:
        env = {
            **os.environ,
            "CLICKS_ROOT": str(root),
            "CLICKS_BATCH": str(bench_live.BUILD_BATCH),
            "CLICKS_FACTOR": "4",
            "PYSPARK_PYTHON": sys.executable,
        }
        command = [
            *(sys.executable, "-m", "spark_elastic", "job", "run", bench_live.JOB),
            *("--containers", "2", "--port", str(port), "--store", store),
            *options,
            *(arg for peer in peers for arg in ("--peer", peer)),
        ]
        self.root = root
        self.url = url_of(port)
        self.name = name
        self.log_path = root / f"{name}.log"
        self.log_file = self.log_path.open("w")
        self.lines: list[tuple[float, str]] = []
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.log_file,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((time.time(), line.strip()))

    def line(self, prefix: str, timeout: float = 120.0) -> tuple[float, str]:
        """The first line it printed that starts with ``prefix``, and when it came."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [(t, line) for t, line in self.lines if line.startswith(prefix)]
            if found:
                return found[0]
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:]
                raise RuntimeError(
                    f"{self.name} exited {self.process.returncode} before {prefix!r}: "
                    f"{tail[0] if tail else 'no output'}"
                )
            time.sleep(POLL_S)
        raise TimeoutError(f"no {prefix!r} line from {self.name} within {timeout:.0f} s")

    def kill(self) -> float:
        """SIGKILL it alone (its containers live on); when the signal was sent."""
        killed = time.time()
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        return killed

    def stop(self) -> None:
        """SIGTERM (a leader stops its containers), SIGKILL past a deadline; by its PID."""
        bench_live.stop_process(self.process)
        self.log_file.close()


def running(status: dict[str, Any]) -> dict[str, int]:
    """The running containers a status shows: id -> PID."""
    return {c["containerId"]: c["pid"] for c in status["containers"] if c["state"] == "running"}


def wait_for(what: str, condition: Any, timeout: float) -> Any:
    """``condition()`` once it is truthy, polled every 50 ms (HTTP errors, a 409 among them,
    and refused connections count as not yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            value = condition()
            if value:
                return value
        time.sleep(POLL_S)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def first_heartbeat(new: Coordinator) -> float:
    """When the new leader's status first showed a container heartbeat it answered."""

    def answered() -> float | None:
        try:
            status = get_json(f"{new.url}/status.json")
        except urllib.error.HTTPError as error:
            if error.code == 409:  # still standing by
                return None
            raise
        return time.time() if status["counters"].get("heartbeats_alive", 0) > 0 else None

    return float(wait_for("a heartbeat answered by the new leader", answered, timeout=180))


def intervals(out: Path, containers: list[str], since: float, until: float) -> list[float]:
    """Seconds between each container's published batches in [since, until], pooled."""
    result = []
    for container in containers:
        times = [t for t in published(out, container) if since <= t <= until]
        result += [b - a for a, b in itertools.pairwise(times)]
    return sorted(result)


def run_case(name: str, case: Case, keys: int, server: Any) -> dict[str, Any]:
    from kafka_jvm import free_port  # type: ignore[import-not-found]

    started: list[Coordinator] = []
    pids: dict[str, int] = {}
    trickle: Trickle | None = None

    def seen(status: dict[str, Any]) -> dict[str, int]:
        now = running(status)
        pids.update({c["containerId"]: c["pid"] for c in status["containers"] if c["pid"]})
        return now

    with bench_live.case_dir(f"failover-{name}") as tmp:
        root = Path(tmp)
        out = root / "out"
        try:
            log = EmbeddedLog(root / "log", fsync=False)
            log.create_topic("clicks", 2)
            for start in range(0, keys, 50_000):
                send(log, [f"user-{i}".encode() for i in range(start, min(start + 50_000, keys))])
            store = (
                server.create_database(f"failover_{name}")
                if case.postgresql
                else str(root / "coordinator.db")
            )
            ports = (free_port(), free_port())
            peers = ((url_of(ports[1]),), (url_of(ports[0]),)) if case.postgresql else ((), ())
            leader = Coordinator(root, ports[0], store, case.options, peers[0], "coordinator-a")
            started.append(leader)
            leader.line("status: ")
            began = time.monotonic()
            bench_live.wait_until(f"{keys} keys of state built", leader.caught_up, timeout=600)
            print(f"    built {keys} keys of state in {time.monotonic() - began:.0f} s", flush=True)
            trickle = Trickle(log, keys)
            trickle.start()
            standby = None
            if case.postgresql:
                standby = Coordinator(
                    root, ports[1], store, case.options, peers[1], "coordinator-b"
                )
                started.append(standby)
                print(f"    {standby.line('standby: ')[1]}", flush=True)
                wait_for(
                    "the standby listed by the leader",
                    lambda: leader.status()["coordinator"]["standbys"],
                    timeout=120,
                )
            steady_from = time.time()
            ids = sorted(seen(leader.status()))
            if len(ids) != 2:
                raise RuntimeError(f"expected 2 running containers, found {ids}")
            bench_live.wait_until(
                "both containers publishing",
                lambda: all(
                    len([t for t in published(out, c) if t > steady_from]) >= 3 for c in ids
                ),
                timeout=300,
            )
            time.sleep(max(0.0, steady_from + STEADY_S - time.time()))
            before = leader.status()
            seen(before)

            killed = leader.kill()
            if standby is None:
                # The baseline: the same coordinator again, on the same port and store, at once.
                new = Coordinator(root, ports[0], store, case.options, (), "coordinator-again")
                started.append(new)
            else:
                new = standby
            answered = first_heartbeat(new)
            serving = new.line("status: ", timeout=60)[0]
            print(
                f"    killed; new leader serving after {serving - killed:.2f} s, first heartbeat "
                f"answered after {answered - killed:.2f} s",
                flush=True,
            )
            # The new leader answers heartbeats from when it serves; the 50 ms polls see the
            # first one a little later, and a container may publish in between.
            back = min(serving, answered)
            firsts = [
                bench_live.wait_until(
                    f"{c}'s first batch under the new leader",
                    lambda c=c: [t for t in published(out, c) if t > back],
                    timeout=180,
                )[0]
                for c in ids
            ]
            settled = max(firsts)
            wait_for(
                "the new leader's wait over",
                lambda: new.status()["coordinator"]["waitsS"] == 0,
                timeout=case.store_lease_s + case.margin_s + 120,
            )
            # A tick or two past the wait: a container it had not heard from would be failed
            # over now (its lease from the new leader's start is over by then).
            time.sleep(max(3.0, settled + AROUND_S + 1 - time.time()))
            after = new.status()
            after_ids = sorted(seen(after))
            kept_writing = [t for c in ids for t in published(out, c) if killed < t < back]
            every = intervals(out, ids, killed - STEADY_S, killed)
            return {
                "case": name,
                "failover": answered - killed,
                "serving": serving - killed,
                "gap": job_gap(new, killed - AROUND_S, settled + AROUND_S),
                "kept_writing": max(kept_writing) - killed if kept_writing else None,
                "resumed": settled - killed,
                "intervals": every,
                "failovers": after["counters"].get("failovers", 0),
                "same": after_ids == ids,
                "containers": f"{len(after_ids)} of {len(ids)}",
                "epochs": (before["coordinator"]["epoch"], after["coordinator"]["epoch"]),
            }
        finally:
            if trickle is not None:
                trickle.stop()
            for coordinator in reversed(started):
                coordinator.stop()
            for pid in pids.values():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


def goal(case: Case, row: dict[str, Any]) -> float | None:
    """Store lease + margin + one micro-batch interval (median before the kill)."""
    if not case.postgresql or not row["intervals"]:
        return None
    return case.store_lease_s + case.margin_s + float(statistics.median(row["intervals"]))


def verdict(target: float | None, row: dict[str, Any]) -> str:
    """The goal, and whether the failover time and the longest gap are within it."""
    if target is None:
        return "-"
    missed = [what for what in ("failover", "gap") if row[what] > target]
    return f"{target:.1f} ({'missed by the ' + ' and '.join(missed) if missed else 'met'})"


def table(rows: list[dict[str, Any]]) -> None:
    print("\n### Coordinator failover: the leader SIGKILLed, 2 containers running\n")
    print(
        "| case | leases (store / container / margin) | failover: kill to first heartbeat "
        "answered by the new leader (s) | new leader serving after (s) | longest output gap (s) "
        "| output: last batch before the new leader, every container again (s after the kill) "
        "| micro-batch interval before the kill: median (max) (s) "
        "| goal: store lease + margin + interval (s) | failovers; same containers |"
    )
    print("|---|---|---:|---:|---:|---|---:|---:|---|")
    for row in rows:
        case = CASES[row["case"]]
        store = f"{case.store_lease_s:g} s" if case.postgresql else "none (file lock)"
        head = f"| {case.label} | {store} / {case.lease_s:g} s / {case.margin_s:g} s |"
        if "error" in row:
            print(f"{head} failed: {row['error']} | - | - | - | - | - | - |")
            continue
        every = row["intervals"]
        interval = f"{statistics.median(every):.1f} ({every[-1]:.1f})" if every else "-"
        met = verdict(goal(case, row), row)
        kept = "-" if row["kept_writing"] is None else f"{row['kept_writing']:.1f}"
        print(
            f"{head} **{row['failover']:.2f}** | {row['serving']:.2f} | **{row['gap']:.1f}** "
            f"| {kept}, {row['resumed']:.1f} | {interval} | {met} "
            f"| {row['failovers']}; {'yes' if row['same'] else 'NO'} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}"
    )
    parser.add_argument("--keys", type=int, default=10_000, help="keys of state (10000)")
    parser.add_argument("--keep", type=Path, help="keep each case's files under this directory")
    args = parser.parse_args()
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown or not names:
        parser.error(f"--cases: expected some of {', '.join(CASES)}, found {args.cases!r}")
    bench_live.KEEP = args.keep
    # Stopped by `timeout` or `kill`: unwind, so that every process started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"$ {command_line()}", flush=True)
    print(
        f"bench_failover: {os.cpu_count()} cores, trigger 1 s, factor 4, 2 partitions of the "
        f"embedded log, 2 containers, {args.keys} keys, ~{bench_live.TRICKLE_PER_S} records/s",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        server = None
        if any(CASES[n].postgresql for n in names):
            from postgresql_server import running_postgresql  # type: ignore[import-not-found]

            server = stack.enter_context(running_postgresql())
            print(f"PostgreSQL on 127.0.0.1:{server.port} (pid {server.pid})", flush=True)
        for name in names:
            case = CASES[name]
            print(f"\n{name}: {case.label}", flush=True)
            try:
                row = run_case(name, case, args.keys, server)
            except Exception as error:
                print(f"  failed: {failed(error)}", flush=True)
                rows.append({"case": name, "error": failed(error)})
                continue
            rows.append(row)
            every = row["intervals"] or [float("nan")]
            kept = row["kept_writing"]
            print(
                f"  failover {row['failover']:.2f} s (serving at {row['serving']:.2f} s), longest "
                f"output gap {row['gap']:.1f} s; last batch before the new leader "
                f"{'-' if kept is None else f'{kept:.1f}'} s after the kill, every container "
                f"published again {row['resumed']:.1f} s after it; micro-batches every "
                f"{statistics.median(every):.1f} s (max {every[-1]:.1f}); failovers "
                f"{row['failovers']}, containers {row['containers']} the same: {row['same']}; "
                f"epochs {row['epochs'][0]} -> {row['epochs'][1]}",
                flush=True,
            )
    table(rows)
    print(f"\n(run took {time.monotonic() - began:.0f} s)")


if __name__ == "__main__":
    main()
