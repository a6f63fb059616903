"""Offline rescale of a stateful query's checkpoint on the local disk, on HDFS and on S3.

Run: ``.venv/bin/python benchmarks/bench_rescale_storage.py`` (``--keys 1000000``,
``--storage local,hdfs,s3``, ``--runs 1``). Needs ``make jars`` (the MiniDFS,
s3proxy and S3A jars). Nothing else should run beside it.

``bench_stateful.py``'s rescale, with the checkpoints on each file system in
turn: the local disk, a real HDFS (a MiniDFS NameNode and DataNode in their
own JVM) and a real S3 server (s3proxy, through S3A with conditional writes),
both on loopback, started once for the run from ``tests/storage_jvm.py`` and
stopped by their PIDs at its end, failed or not. On each, the same running
count (``bench_stateful``'s per-key processor, 2 partitions of the embedded
log, RocksDB) builds ``--keys`` keys of state at factor 2 in a checkpoint
there (off the local disk with RocksDB's changelog checkpointing, as
``with_task_state`` starts a query there); then ``spark_elastic.rescale``
splits it to factor 4 into a new checkpoint beside it, and merges that back
to factor 2 into a third. Each rescale runs in a fresh process after its
SparkSession started (as a container that rescales its checkpoint and
restarts its query would), timed alone (*offline*), then the new query's
first micro-batch (20,000 new records of the same keys) on it: downtime is
the two together. Beside the times: the source checkpoint's files and
bytes (what a rescale may read), the new one's after the rescale (what it
wrote), and the bytes and calls that went through Hadoop to the checkpoint's
file system during the rescale (the JVM's ``FileSystem`` statistics of its
scheme: on HDFS and S3 the traffic with the server; on the local disk the
bytes of every local file Spark read or wrote through Hadoop, temporary ones
too, and no calls, which Hadoop does not count there).
File systems take turns: the merges run in the splits' reverse order;
with ``--runs`` above 1 everything runs again from a new log, the order
rotated, and medians are reported. The servers are on this machine, so the
figures are the file systems' protocols and round trips, not a network's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_live import command_line
from bench_stateful import BATCH, PARTITIONS, TOPIC, counter_processor, peak_memory_mb, produce

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # storage_jvm: the servers the specs start

FILE_SYSTEMS = ("local", "hdfs", "s3")
LABELS = {"local": "local disk", "hdfs": "HDFS", "s3": "S3"}
CHANGES = (("split 2 -> 4", "f2", "f4", 4), ("merge 4 -> 2", "f4", "f2-again", 2))
"""Each change: its label, the checkpoint it reads, the one it writes, the new factor."""


# -- the measured side, in a fresh process -----------------------------------------------------


def session(conf: dict[str, str]) -> Any:
    from spark_elastic import register_log_source
    from spark_elastic.dataplane.session import local_session

    spark = local_session("bench-rescale-storage", conf={"spark.driver.memory": "4g", **conf})
    register_log_source(spark)
    return spark


def count(spark: Any, log_dir: str, checkpoint: str, factor: int, per_trigger: int) -> float:
    """Seconds from start to end of the running count over what the log holds beyond the
    checkpoint (``availableNow``, ``per_trigger`` records a micro-batch at most)."""
    from spark_elastic import starting_offsets, with_task_state

    events = (
        spark.readStream.format("elastic-log")
        .option("path", log_dir)
        .option("subscribe", TOPIC)
        .option("startingOffsets", starting_offsets(checkpoint))
        .option("maxOffsetsPerTrigger", per_trigger)
        .load()
    )
    out = events.transform(
        with_task_state(
            counter_processor(),
            job="bench",
            checkpoint_location=checkpoint,
            elasticity_factor=factor,
            partitions={TOPIC: PARTITIONS},
        )
    )
    started = time.perf_counter()
    query = (
        out.writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query on {checkpoint} failed: {query.exception()}")
    return time.perf_counter() - started


def size(spark: Any, checkpoint: str) -> tuple[int, int]:
    """Files and bytes under a checkpoint."""
    from spark_elastic.storage import open_storage

    files = open_storage(checkpoint, spark).files(checkpoint)
    return len(files), sum(length for _, length in files)


def hadoop_io(spark: Any, scheme: str) -> tuple[int, int, int, int]:
    """Bytes read, bytes written, read calls, write calls of ``scheme`` in this JVM so far."""
    for stats in spark._jvm.org.apache.hadoop.fs.FileSystem.getAllStatistics():
        if str(stats.getScheme()) == scheme:
            return (
                int(stats.getBytesRead()),
                int(stats.getBytesWritten()),
                int(stats.getReadOps()) + int(stats.getLargeReadOps()),
                int(stats.getWriteOps()),
            )
    return (0, 0, 0, 0)


def private(command: str, argv: list[str]) -> None:
    """One step in a fresh process; prints its figures as JSON on its last line."""
    conf, log_dir, checkpoint = json.loads(argv[0]), argv[1], argv[2]
    spark = session(conf)
    if command == "_build":
        seconds = count(spark, log_dir, checkpoint, 2, int(argv[3]))
        print(json.dumps({"seconds": seconds}))
    elif command == "_rescale":
        from spark_elastic import rescale

        target, factor = argv[3], int(argv[4])
        scheme = target.split("://", 1)[0] if "://" in target else "file"
        source_files, source_bytes = size(spark, checkpoint)
        before = hadoop_io(spark, scheme)
        started = time.perf_counter()
        rescale(checkpoint, target, factor, spark)
        offline = time.perf_counter() - started
        after = hadoop_io(spark, scheme)
        target_files, target_bytes = size(spark, target)
        first = count(spark, log_dir, target, factor, BATCH)
        figures = {
            "offline": offline,
            "first": first,
            "source_files": source_files,
            "source_bytes": source_bytes,
            "target_files": target_files,
            "target_bytes": target_bytes,
            "io_read": after[0] - before[0],
            "io_written": after[1] - before[1],
            "io_read_calls": after[2] - before[2],
            "io_write_calls": after[3] - before[3],
            "peak_mb": peak_memory_mb(),
        }
        print(json.dumps(figures))
    spark.stop()


# -- the run -----------------------------------------------------------------------------------


def child(what: str, argv: list[str]) -> dict[str, float]:
    """A step in a fresh process (killed with us: ``subprocess.run`` kills it on our way out)."""
    done = subprocess.run(
        [sys.executable, __file__, *argv], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def one_run(
    work: Path,
    roots: dict[str, str],
    conf: dict[str, str],
    keys: int,
    order: list[str],
) -> dict[tuple[str, str], dict[str, float]]:
    """Build, split and merge on each file system of ``order``; figures by (fs, change).

    A step that fails is reported, and its file system's later steps are left out.
    """
    log_dir = work / "log"
    produce(log_dir, keys, keys)
    base = {fs: f"{roots[fs]}/rescale-{uuid.uuid4().hex[:8]}" for fs in order}
    settings = json.dumps(conf)
    failed: set[str] = set()

    def step(fs: str, what: str, argv: list[str]) -> dict[str, float] | None:
        try:
            return child(f"{what} on {LABELS[fs]}", [argv[0], settings, str(log_dir), *argv[1:]])
        except RuntimeError as error:
            print(f"  {error}", file=sys.stderr, flush=True)
            failed.add(fs)
            return None

    for fs in order:
        built = step(fs, f"building {keys:,} keys", ["_build", f"{base[fs]}/f2", str(keys)])
        if built is not None:
            print(
                f"  {LABELS[fs]}: built {keys:,} keys at factor 2 in {built['seconds']:.0f} s",
                flush=True,
            )
    figures: dict[tuple[str, str], dict[str, float]] = {}
    for i, (label, old, new, factor) in enumerate(CHANGES):
        # New records for the new query's first micro-batch: the same on every file system.
        produce(log_dir, BATCH, keys, seed=factor)
        for fs in order if i % 2 == 0 else order[::-1]:
            if fs in failed:
                continue
            argv = ["_rescale", f"{base[fs]}/{old}", f"{base[fs]}/{new}", str(factor)]
            timed = step(fs, label, argv)
            if timed is None:
                continue
            figures[fs, label] = timed
            print(
                f"  {LABELS[fs]}: {label} offline {timed['offline']:.1f} s, first micro-batch "
                f"{timed['first']:.1f} s; wrote {timed['target_files']:.0f} files, "
                f"{timed['target_bytes'] / 1e6:.1f} MB",
                flush=True,
            )
    return figures


def table(
    results: dict[tuple[str, str], list[dict[str, float]]], storages: list[str], keys: int
) -> None:
    print(f"\n### Offline rescale of {keys:,} keys of state, checkpoints on each file system\n")
    print(
        "| checkpoints on | change | offline `rescale` (s) | against the local disk "
        "| first micro-batch (s) | downtime (s) | source: files, MB | written: files, MB "
        "| through Hadoop: MB read, MB written (read + write calls) | peak memory (MiB) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, *_ in CHANGES:
        local = results.get(("local", label))
        base = statistics.median(r["offline"] for r in local) if local else None
        for fs in storages:
            runs = results.get((fs, label))
            if not runs:
                print(f"| {LABELS[fs]} | {label} | failed | - | - | - | - | - | - | - |")
                continue
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            ratio = f"{med['offline'] / base:.2f}x" if base else "-"
            calls = (
                f" ({med['io_read_calls']:,.0f} + {med['io_write_calls']:,.0f})"
                if fs != "local"
                else ""
            )
            print(
                f"| {LABELS[fs]} | {label} | {med['offline']:.1f} | {ratio} | {med['first']:.1f} "
                f"| {med['offline'] + med['first']:.1f} "
                f"| {med['source_files']:,.0f}, {med['source_bytes'] / 1e6:.1f} "
                f"| {med['target_files']:,.0f}, {med['target_bytes'] / 1e6:.1f} "
                f"| {med['io_read'] / 1e6:.1f}, {med['io_written'] / 1e6:.1f}{calls} "
                f"| {med['peak_mb']:,.0f} |"
            )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        private(sys.argv[1], sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys of state")
    parser.add_argument(
        "--storage",
        default=",".join(FILE_SYSTEMS),
        help=f"comma-separated, of {', '.join(FILE_SYSTEMS)} (default: all)",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs from scratch; medians")
    args = parser.parse_args()
    storages = list(dict.fromkeys(s for s in args.storage.split(",") if s))
    if not storages or any(s not in FILE_SYSTEMS for s in storages):
        parser.error(
            f"--storage: expected some of {', '.join(FILE_SYSTEMS)}, found {args.storage!r}"
        )
    for name in ("keys", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected a positive count, found {getattr(args, name)}")
    # Stopped by `timeout` or `kill`: unwind, so that the servers and the step running stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"$ {command_line()}", flush=True)

    import storage_jvm  # type: ignore[import-not-found]

    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        servers = {}
        try:
            if "hdfs" in storages:
                servers["hdfs"] = stack.enter_context(storage_jvm.running_hdfs())
            if "s3" in storages:
                servers["s3"] = stack.enter_context(storage_jvm.running_s3())
        except storage_jvm.StorageJvmError as error:
            sys.exit(f"bench_rescale_storage: {error}")
        conf = {k: v for server in servers.values() for k, v in server.spark_conf().items()}
        if "s3" in servers:
            conf["spark.jars"] = ",".join(storage_jvm.s3a_jars())
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-rescale-")))
        roots = {"local": str(tmp / "checkpoints"), **{k: s.uri for k, s in servers.items()}}
        for run in range(args.runs):
            order = storages[run % len(storages) :] + storages[: run % len(storages)]
            print(f"run {run + 1} of {args.runs} ({', '.join(LABELS[s] for s in order)}):")
            figures = one_run(tmp / f"run-{run}", roots, conf, args.keys, order)
            for key, value in figures.items():
                results.setdefault(key, []).append(value)
    table(results, storages, args.keys)


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    if not sys.argv[1:2] or not sys.argv[1].startswith("_"):
        print(f"({time.perf_counter() - started:.0f} s in all)", file=sys.stderr)
