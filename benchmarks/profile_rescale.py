"""Where a rescale's downtime goes, in a warm process: the profile behind docs/benchmarks.md's note.

Run: ``.venv/bin/python benchmarks/profile_rescale.py [KEYS]`` (default 1,000,000).
One process builds ``KEYS`` keys of running-count state at factor 2 (the same
query as ``bench_stateful.py``), splits it to factor 4 with ``rescale``, and
runs the first micro-batch of 20,000 new records, as a container that
rescales its own checkpoint would (its JVM and Python workers already warm).
It prints the two times, the first batch's ``durationMs`` and its state
operator's figures. For Python-side samples, wrap it in
``py-spy record --subprocesses --idle -f raw -o out.txt -- ...``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import bench_stateful as bench


def main(keys: int) -> None:
    from spark_elastic import rescale

    work = Path(tempfile.mkdtemp(prefix="profile-rescale-"))
    try:
        log = work / "log"
        bench.produce(log, keys, keys)
        spark = bench.session()
        print(f"built {keys:,} keys in {bench.ours(spark, log, work / 'f2', 2, keys):.1f} s")
        bench.produce(log, bench.BATCH, keys, seed=4)
        started = time.perf_counter()
        rescale(work / "f2", work / "f4", 4, spark)
        print(f"rescale (offline): {time.perf_counter() - started:.1f} s")
        out = bench.counted(spark, log, work / "f4", 4, bench.BATCH)
        started = time.perf_counter()
        query = bench.start_noop(out, work / "f4")
        query.awaitTermination()
        print(f"first micro-batch: {time.perf_counter() - started:.1f} s")
        progress = query.lastProgress
        print("durationMs", json.dumps(progress["durationMs"]))
        for operator in progress["stateOperators"]:
            figures = {k: v for k, v in operator.items() if k != "customMetrics"}
            print("state operator", json.dumps(figures))
            print("custom metrics", json.dumps(operator.get("customMetrics", {})))
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
