"""A local session's Python processes: pyspark compiled against pyspark from Spark's zip.

Run: ``.venv/bin/python benchmarks/bench_spark_home.py`` (``--runs 2``; about 5
minutes). Nothing else should run beside it.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the path of every
Python process it starts, and Python compiles what it imports from a zip
each time; spark-elastic's local sessions start their JVM from a home of
links without the zips (``spark_elastic/dataplane/spark_home.py``). Two
measures, each variant in turn, alternating, medians:

1. ``import``: a fresh interpreter importing what a Python worker and the
   transform-with-state driver worker import (``pyspark.worker``,
   ``pyspark.sql.streaming.transform_with_state_driver_worker``), with
   Spark's zips first on its path (as Spark starts it) and without;
2. ``session``: a fresh process starting a local session (``local[2]``) and a
   first stateful query (the embedded log, a vectorized ``with_task_state``
   at factor 4, two batches of 2,000 records, noop sink), with the home of
   links (the default) and with ``SPARK_ELASTIC_SPARK_HOMES=off``; its wall
   time, and the machine's CPU-seconds (``/proc/stat``) from launch to exit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMPORTS = "import pyspark.worker, pyspark.sql.streaming.transform_with_state_driver_worker"


def cpu_seconds() -> float:
    """The machine's busy CPU-seconds so far (``/proc/stat``)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def timed(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall and machine CPU seconds of one process, and its last line of stdout."""
    cpu, started = cpu_seconds(), time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    lines = done.stdout.strip().splitlines()
    return wall, cpu_seconds() - cpu, lines[-1] if lines else ""


def session_child() -> None:
    """In the child: a session and a first stateful query; prints its phases as JSON."""
    import tempfile

    sys.path.insert(0, str(HERE))
    from bench_record_path import one

    from spark_elastic import register_log_source
    from spark_elastic.dataplane.session import local_session

    started = time.perf_counter()
    spark = local_session("bench-spark-home", conf={"spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    register_log_source(spark)
    session_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix="bench-spark-home-") as tmp:
        query_started = time.perf_counter()
        one(spark, Path(tmp), "+ state, vectorized", 4, 2000, 2)
        query_s = time.perf_counter() - query_started
    spark.stop()
    print(json.dumps({"session_s": session_s, "query_s": query_s}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        session_child()
        return

    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = os.pathsep.join(str(p) for p in sorted(lib.glob("*.zip")))
    base = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    base.pop("PYTHONPATH", None)
    imports: dict[str, list[float]] = {}
    sessions: dict[str, list[dict[str, float]]] = {}
    for run in range(args.runs):
        for name, env in [("from Spark's zips", {**base, "PYTHONPATH": zips}), ("compiled", base)]:
            for _ in range(3):
                wall, _cpu, _ = timed([sys.executable, "-c", IMPORTS], env)
                imports.setdefault(name, []).append(wall)
        variants = [
            ("pyspark's home (zips first)", {**base, "SPARK_ELASTIC_SPARK_HOMES": "off"}),
            ("a home of links (the default)", base),
        ]
        for name, env in variants if run % 2 == 0 else variants[::-1]:
            wall, cpu, last = timed([sys.executable, __file__, "--child"], env)
            phases = json.loads(last)
            sessions.setdefault(name, []).append({"wall_s": wall, "cpu_s": cpu, **phases})
            print(f"run {run + 1}, {name}: {sessions[name][-1]}", file=sys.stderr)
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"load average after: {' '.join(load)}; medians of {args.runs} runs")
    print("\n| a fresh interpreter importing a worker's modules | seconds |\n|---|---:|")
    for name, values in imports.items():
        print(f"| {name} | {statistics.median(values):.2f} |")
    print(
        "\n| a fresh process: local session and first stateful query | session | "
        "first query (2 batches) | process, launch to exit | machine CPU-seconds |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, runs in sessions.items():

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        print(
            f"| {name} | {med('session_s'):.1f} s | {med('query_s'):.1f} s "
            f"| {med('wall_s'):.1f} s | {med('cpu_s'):.1f} |"
        )


if __name__ == "__main__":
    main()
