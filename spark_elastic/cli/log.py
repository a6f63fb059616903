"""``spark-elastic log``: create, describe, produce to and grow topics of an embedded log.

No Spark is involved: these commands work on the log directory directly, so
they start fast and can feed a running streaming query.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from spark_elastic.errors import ArgumentError

__all__ = ["register", "run"]

# Records per producer call: bounds memory while keeping one append per partition per chunk.
_CHUNK = 10_000


def _int_at_least(minimum: int, words: str) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers from ``minimum`` up."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {words}, found {text!r}")
        return value

    return parse


_positive = _int_at_least(1, "a positive integer")
_non_negative = _int_at_least(0, "a non-negative integer")


def register(subparsers: Any) -> None:
    """Add the ``log`` command and its subcommands."""
    parser = subparsers.add_parser(
        "log",
        help="create, describe, produce to and grow topics of an embedded log",
        description=(
            "Work with an embedded partitioned log: a directory of Kafka-like topics that the "
            "'elastic-log' Spark source reads. Keys are partitioned like Kafka's default producer."
        ),
    )
    parser.set_defaults(run=run)
    commands = parser.add_subparsers(
        dest="log_command", metavar="SUBCOMMAND", required=True, parser_class=type(parser)
    )

    create = commands.add_parser("create", help="create a topic (and the log directory)")
    create.add_argument("dir", metavar="DIR", help="the log directory; created if missing")
    create.add_argument("topic", metavar="TOPIC")
    create.add_argument("--partitions", type=_positive, required=True, metavar="N")

    describe = commands.add_parser("describe", help="print topics, partitions and end offsets")
    describe.add_argument("dir", metavar="DIR")
    describe.add_argument("topic", metavar="TOPIC", nargs="?", help="one topic (default: all)")
    describe.add_argument("--json", action="store_true", help="print JSON instead of a table")

    produce = commands.add_parser(
        "produce",
        usage="%(prog)s DIR TOPIC (--file FILE | --generate N --keys K [--seed S])",
        help="append records from a file or generated data",
        description=(
            "Append records. A file holds one record per line: 'KEY<TAB>VALUE', or JSON objects "
            '{"key": ..., "value": ..., "timestamp": ms} (null key or value allowed) when its '
            "first line starts with '{'. Blank lines are skipped. The whole file is checked "
            "before anything is appended."
        ),
    )
    produce.add_argument("dir", metavar="DIR")
    produce.add_argument("topic", metavar="TOPIC")
    source = produce.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", metavar="FILE", help="read records from FILE ('-' for stdin)")
    source.add_argument(
        "--generate", type=_positive, metavar="N", help="append N generated keyed records"
    )
    produce.add_argument(
        "--keys",
        type=_positive,
        metavar="K",
        help="required with --generate: draw keys from K keys",
    )
    produce.add_argument(
        "--seed", type=_non_negative, default=0, metavar="S", help="with --generate (default: 0)"
    )

    grow = commands.add_parser(
        "grow",
        help="raise a topic's partition count (SEP-5); counts never shrink",
        description=(
            "Raise a topic's partition count. The new count must be a multiple of the current "
            "one: a key then moves only to partitions of its old task (new partition p joins "
            "the task of p mod the old count), so jobs keep their tasks and state (SEP-5)."
        ),
    )
    grow.add_argument("dir", metavar="DIR")
    grow.add_argument("topic", metavar="TOPIC")
    grow.add_argument("--partitions", type=_positive, required=True, metavar="N")
    grow.add_argument(
        "--any-count",
        action="store_true",
        help="allow a count that is not a multiple (for topics no job reads: keys move between "
        "tasks, and jobs must be planned afresh)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the chosen ``log`` subcommand."""
    handlers = {
        "create": run_create,
        "describe": run_describe,
        "produce": run_produce,
        "grow": run_grow,
    }
    return handlers[args.log_command](args)


def run_create(args: argparse.Namespace) -> int:
    """``log create``: make the topic, print what exists."""
    from spark_elastic.log.embedded import EmbeddedLog

    described = EmbeddedLog(args.dir).create_topic(args.topic, args.partitions)
    print(f"created topic {described.topic} with {described.partitions} partitions in {args.dir}")
    return 0


def run_describe(args: argparse.Namespace) -> int:
    """``log describe``: a table (or JSON) of topics, partitions, records and end offsets."""
    from spark_elastic.log.embedded import EmbeddedLog

    log = EmbeddedLog(args.dir, create=False)
    topics = [args.topic] if args.topic is not None else log.topics()
    descriptions = [log.describe(topic) for topic in topics]
    if args.json:
        json.dump({"topics": [d.to_json() for d in descriptions]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    rows = [
        (
            d.topic,
            str(d.partitions),
            str(d.records),
            " ".join(f"{p}:{o}" for p, o in enumerate(d.end_offsets)),
        )
        for d in descriptions
    ]
    header = ("TOPIC", "PARTITIONS", "RECORDS", "END OFFSETS")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        print(f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}")
    return 0


def run_produce(args: argparse.Namespace) -> int:
    """``log produce``: append a file's records or generated ones, print the new end offsets."""
    from spark_elastic.log.embedded import EmbeddedLog

    log = EmbeddedLog(args.dir, create=False)
    if args.generate is not None:
        if args.keys is None:
            raise ArgumentError.invalid(
                "--keys", "a key count with --generate (--generate N --keys K)", None
            )
        chunks: Iterable[_Records] = _generated(args.generate, args.keys, args.seed)
    else:
        if args.keys is not None:
            raise ArgumentError.invalid("--keys", "only with --generate", args.keys)
        if args.file == "-":
            records = _parse(sys.stdin, "<stdin>")
        else:
            try:
                with open(args.file, encoding="utf-8") as handle:
                    records = _parse(handle, args.file)
            except OSError as exc:
                raise ArgumentError.invalid("--file", "a readable file", args.file) from exc
        chunks = _chunked(records)
    produced = 0
    with log.producer(args.topic) as producer:
        for keys, values, timestamps in chunks:
            producer.send_many(keys, values, timestamps)
            produced += len(keys)
    described = log.describe(args.topic)
    ends = " ".join(f"{p}:{o}" for p, o in enumerate(described.end_offsets))
    print(f"produced {produced} records to {args.topic}; end offsets {ends}")
    return 0


def run_grow(args: argparse.Namespace) -> int:
    """``log grow``: raise the partition count."""
    from spark_elastic.log.embedded import EmbeddedLog

    log = EmbeddedLog(args.dir, create=False)
    before = log.partition_count(args.topic)
    if args.partitions > before and args.partitions % before and not args.any_count:
        raise ArgumentError.invalid(
            "--partitions",
            f"a multiple of {args.topic}'s {before} partitions (e.g. {2 * before}), so that jobs "
            "keep their tasks and state (SEP-5: new partition p joins the task of p mod "
            f"{before}); --any-count allows other counts for topics no job reads",
            args.partitions,
        )
    described = log.grow(args.topic, args.partitions)
    print(f"topic {args.topic}: {before} -> {described.partitions} partitions")
    return 0


_Records = tuple[list[str | None], list[str | None], list[int] | None]


def _parse(lines: Iterable[str], name: str) -> list[tuple[str | None, str | None, int | None]]:
    """Every record of a file, checked; errors name the file and line."""
    records: list[tuple[str | None, str | None, int | None]] = []
    as_json: bool | None = None
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        if as_json is None:
            as_json = line.lstrip().startswith("{")
        where = f"{name}, line {number}"
        records.append(_json_record(line, where) if as_json else _tsv_record(line, where))
    return records


def _tsv_record(line: str, where: str) -> tuple[str | None, str | None, int | None]:
    key, tab, value = line.partition("\t")
    if not tab:
        raise ArgumentError.invalid(where, "KEY<TAB>VALUE", line[:80])
    return key, value, None


def _json_record(line: str, where: str) -> tuple[str | None, str | None, int | None]:
    expected = 'a JSON object {"key": str|null, "value": str|null, "timestamp": ms}'
    try:
        record = json.loads(line)
    except ValueError:
        record = None
    if not isinstance(record, dict) or not set(record) <= {"key", "value", "timestamp"}:
        raise ArgumentError.invalid(where, expected, line[:80])
    key, value, timestamp = record.get("key"), record.get("value"), record.get("timestamp")
    if not all(isinstance(v, str | None) for v in (key, value)) or not (
        timestamp is None or (isinstance(timestamp, int) and not isinstance(timestamp, bool))
    ):
        raise ArgumentError.invalid(where, expected, line[:80])
    return key, value, timestamp


def _chunked(records: list[tuple[str | None, str | None, int | None]]) -> Iterator[_Records]:
    import time

    now = time.time_ns() // 1_000_000
    for begin in range(0, len(records), _CHUNK):
        chunk = records[begin : begin + _CHUNK]
        yield (
            [r[0] for r in chunk],
            [r[1] for r in chunk],
            [now if r[2] is None else r[2] for r in chunk],
        )


def _generated(count: int, keys: int, seed: int) -> Iterator[_Records]:
    """``count`` records with keys ``key-<j>`` drawn uniformly from ``keys`` keys."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for begin in range(0, count, _CHUNK):
        drawn = rng.integers(0, keys, size=min(_CHUNK, count - begin)).tolist()
        names: list[str | None] = [f"key-{j}" for j in drawn]
        values: list[str | None] = [
            json.dumps({"key": name, "seq": begin + i}, separators=(",", ":"))
            for i, name in enumerate(names)
        ]
        yield names, values, None
