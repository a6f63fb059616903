"""The autoscaler under a load step, on real containers, against the same job at a fixed size.

Real processes on the embedded log: ``spark-elastic job run`` runs the
click-count job of ``examples/jobs/click_counts.py`` (2 partitions, factor 4:
8 stateful tasks) on one container. Each container reads at most
``--batch`` records per micro-batch of 1 s, so its capacity is fixed
whatever the machine does (on 2 cores, a container's micro-batch of 100
records takes 1-2 s, so about 50-100 records a second; more containers than
cores add little). A producer sends ``--rate`` records a second,
then four times that for ``--step-s`` seconds, then ``--rate`` again for
``--after-s`` seconds. The same load runs twice in one invocation: with
the autoscaler on (window 20 s, cool-down 60 s, scale out past 20 s of
backlog; a stateful job scales through KIP-441 warm-ups), and with it off
(the fixed-size job a user would otherwise run). Every second the total lag
is read from the coordinator's ``/status.json``.

Printed for each: the scaling actions (with their time from the start of
the step and their reason), the time to react (step start to the first
scale-out decision), the time to scale back (step end to the first scale-in
decision: the backlog the step left must drain first), the peak lag, and
the lag when the run ends.

Run (about 35 minutes; nothing else should load the machine)::

    .venv/bin/python benchmarks/bench_autoscale.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from spark_elastic import EmbeddedLog
from spark_elastic.model.names import TaskName

ROOT = Path(__file__).resolve().parents[1]
JOB = f"{ROOT / 'examples' / 'jobs' / 'click_counts.py'}:job"
USERS = 5000


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


class Load(threading.Thread):
    """Sends ``rate(t)`` records a second (t: seconds since start), in tenths of a second."""

    def __init__(self, log: EmbeddedLog, rate: Any) -> None:
        super().__init__(daemon=True)
        self.log, self.rate, self.stopping = log, rate, threading.Event()
        self.started = time.monotonic()
        self.sent = 0

    def run(self) -> None:
        with self.log.producer("clicks") as producer:
            while not self.stopping.wait(0.1):
                due = int(self.rate(time.monotonic() - self.started) * 0.1)
                users = [f"user-{(self.sent + i) % USERS}".encode() for i in range(due)]
                if users:
                    producer.send_many(users, [b"x"] * len(users))
                self.sent += due


def total_lag(url: str) -> int | None:
    """The job's backlog, each record once: a key bucket reports its partition's lag."""
    tasks = get_json(f"{url}/status.json")["tasks"]
    if not tasks or min(t["lag"] for t in tasks) < 0:
        return None
    backlog: float = sum(t["lag"] / TaskName.parse(t["task"]).elasticity_factor for t in tasks)
    return round(backlog)


def run_case(work: Path, autoscale: bool, args: argparse.Namespace) -> dict[str, Any]:
    root = work / ("autoscaled" if autoscale else "fixed")
    log = EmbeddedLog(root / "log", fsync=False)
    log.create_topic("clicks", 2)
    env = {
        **os.environ,
        "CLICKS_ROOT": str(root),
        "CLICKS_BATCH": str(args.batch),
        "PYSPARK_PYTHON": sys.executable,
    }
    scaling = (
        "--autoscale",
        *("--autoscale-max", str(args.max_containers), "--autoscale-drain-ms", "20000"),
        *("--autoscale-window-ms", "20000", "--autoscale-cooldown-ms", "60000"),
        *("--autoscale-busy-lag", str(args.batch)),
    )
    command = [
        sys.executable,
        *("-m", "spark_elastic", "job", "run", JOB, "--containers", "1", "--port", "0"),
        *(scaling if autoscale else ()),
    ]
    with (root / "coordinator.log").open("w") as log_file:
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=log_file, text=True
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            url = line[line.index("http://") :].strip().rstrip("/")
            return _measure(url, log, args)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(180)
            except subprocess.TimeoutExpired:
                process.kill()


def _measure(url: str, log: EmbeddedLog, args: argparse.Namespace) -> dict[str, Any]:
    warm_s = 90.0  # the first container starting, then a steady minute
    step_at, step_end = warm_s, warm_s + args.step_s
    end = step_end + args.after_s
    load = Load(log, lambda t: args.rate * (4 if step_at <= t < step_end else 1))
    load.start()
    lags: list[tuple[float, int]] = []
    try:
        while (now := time.monotonic() - load.started) < end:
            with contextlib.suppress(OSError, ValueError):
                lag = total_lag(url)
                if lag is not None:
                    lags.append((now, lag))
            time.sleep(1.0)
        status = get_json(f"{url}/status.json")
        live = len(get_json(f"{url}/jobModel")["containers"])
    finally:
        load.stopping.set()
        load.join()
    started_at = time.time() - (time.monotonic() - load.started)
    actions = sorted(
        (e["at"] - started_at - step_at, e["detail"])
        for e in status["events"]
        if e["kind"] == "autoscale"
        and e["detail"].startswith("autoscaler ")
        and not e["detail"].startswith(("autoscaler on", "autoscaler off"))
    )
    in_step = [lag for t, lag in lags if t >= step_at]
    return {
        "actions": actions,
        "react_s": next((t for t, d in actions if "scale-out" in d), None),
        "back_s": next((t - args.step_s for t, d in actions if "scale-in" in d), None),
        "peak_lag": max(in_step, default=0),
        "final_lag": lags[-1][1] if lags else None,
        "containers": live,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=40, help="base records a second (40)")
    parser.add_argument("--batch", type=int, default=100, help="records per micro-batch (100)")
    parser.add_argument("--step-s", type=float, default=180, help="how long the x4 step lasts")
    parser.add_argument(
        "--after-s", type=float, default=720, help="how long to watch after it (720)"
    )
    parser.add_argument(
        "--max-containers", type=int, default=2, help="the autoscaler's bound (2: the cores)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-autoscale-") as tmp:
        for autoscale in (True, False):
            name = "autoscaler on" if autoscale else "fixed size (autoscaler off)"
            print(f"== {name}: {args.rate}/s, x4 for {args.step_s:.0f} s", flush=True)
            result = run_case(Path(tmp), autoscale, args)
            for at, detail in result["actions"]:
                print(f"    {at:+6.0f} s  {detail[:160]}")
            react, back = result["react_s"], result["back_s"]
            print(
                f"    actions {len(result['actions'])}, time to react "
                f"{'-' if react is None else f'{react:.0f} s'}, time to scale back "
                f"{'-' if back is None else f'{back:.0f} s'}, peak backlog {result['peak_lag']}, "
                f"backlog at the end {result['final_lag']}, containers at the end "
                f"{result['containers']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
