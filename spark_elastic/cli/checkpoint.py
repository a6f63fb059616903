"""``spark-elastic checkpoint show`` and ``spark-elastic rescale``: stateful checkpoints.

Checkpoints are local paths or URIs of HDFS, S3 and the other file systems
Spark's Hadoop opens; ``--conf KEY=VALUE`` passes the settings that reach
them (``spark.hadoop.*``, ``spark.jars``) to the command's Spark session.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``checkpoint`` and ``rescale`` subcommands."""
    checkpoint = subparsers.add_parser("checkpoint", help="inspect a stateful query's checkpoint")
    actions = checkpoint.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show", help="each virtual task's per-bucket offsets and how far behind they are"
    )
    show.add_argument("checkpoint", metavar="CHECKPOINT_DIR")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _conf_argument(show)
    show.set_defaults(run=_finished(run_show))

    rescale = subparsers.add_parser(
        "rescale",
        help="split or merge the virtual tasks of stopped stateful queries into a new checkpoint",
    )
    rescale.add_argument(
        "--from",
        dest="sources",
        action="append",
        required=True,
        metavar="CHECKPOINT_DIR",
        help="a stopped query's checkpoint (repeatable: queries owning parts of one job)",
    )
    rescale.add_argument("--to", dest="target", required=True, metavar="NEW_CHECKPOINT_DIR")
    rescale.add_argument(
        "--elasticity-factor",
        type=int,
        required=True,
        metavar="F",
        help="the new factor: a power of two from 1 to 1024",
    )
    rescale.add_argument("--json", action="store_true", help="print the result as JSON")
    _conf_argument(rescale)
    rescale.set_defaults(run=_finished(run_rescale))


def _conf_argument(parser: Any) -> None:
    from spark_elastic.cli.job import _conf

    parser.add_argument(
        "--conf",
        dest="conf",
        action="append",
        type=_conf,
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the command's session (repeatable), e.g. "
        "spark.hadoop.fs.s3a.endpoint=...",
    )


def _local(*locations: str) -> bool:
    from spark_elastic.storage import is_local

    return all(is_local(location) for location in locations)


def run_show(args: argparse.Namespace) -> int:
    """Print the checkpoint report."""
    from spark_elastic.state.checkpoint_dir import require_job
    from spark_elastic.state.show import format_report, read_checkpoint

    if _local(args.checkpoint):
        require_job(args.checkpoint)  # fail fast, before starting Spark
    report = read_checkpoint(args.checkpoint, _spark(args.conf))
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_report(report))
    return 0


def run_rescale(args: argparse.Namespace) -> int:
    """Rescale, after every check that needs no Spark has passed."""
    from spark_elastic.model.names import validate_elasticity_factor
    from spark_elastic.state.checkpoint_dir import checkpoint_ref
    from spark_elastic.state.rescale import _check_target, rescale, stopped_source

    validate_elasticity_factor(args.elasticity_factor)
    target = checkpoint_ref(args.target, "--to")
    sources = [checkpoint_ref(s, "--from") for s in args.sources]
    spark = None
    if not _local(args.target, *args.sources):
        spark = _spark(args.conf)  # a remote file system is reached through its JVM
    _check_target(target, sources)
    for source in args.sources:
        stopped_source(source, spark)
    result = rescale(args.sources, args.target, args.elasticity_factor, spark or _spark(args.conf))
    if args.json:
        json.dump(
            {
                "target": str(result.target),
                "elasticityFactor": result.elasticity_factor,
                "tasks": result.task_count,
                "keys": result.keys,
                "checkpoints": result.checkpoints,
                "startingOffsets": result.starting_offsets,
            },
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
    else:
        print(
            f"rescaled {len(args.sources)} checkpoint(s) into {result.target}: factor "
            f"{result.elasticity_factor}, {result.task_count} virtual tasks, {result.keys} keys of "
            f"state, {result.checkpoints} bucket checkpoints; start the query with "
            f"startingOffsets {json.dumps(result.starting_offsets, sort_keys=True)}"
        )
    return 0


def _spark(conf: list[tuple[str, str]] | None = None) -> Any:
    """A local session whose Spark logs only errors, from its very start (driver, once).

    Its JVM is short-lived as a container's is, so it starts as one does: C1
    only, and the host's class archive mapped (or recorded, then moved in by
    :func:`_finished` at the command's end); a ``--conf`` choosing either keeps it.
    """
    from spark_elastic.dataplane.session import local_session

    return local_session("spark-elastic-cli", conf=_session_conf(conf or []))


def _session_conf(conf: list[tuple[str, str]]) -> dict[str, str]:
    """The command's Spark settings: quiet logs, C1, the class archive, then ``--conf``'s."""
    from pathlib import Path

    from spark_elastic.dataplane.session import find_java
    from spark_elastic.runtime.container.class_archive import with_class_archive
    from spark_elastic.runtime.container.compiler import with_compiler

    quiet = Path(__file__).with_name("quiet-log4j2.properties")
    options = f"-Xss16m -Dlog4j2.configurationFile={quiet.as_uri()}"
    settings = {"spark.driver.extraJavaOptions": options, **dict(conf)}
    return with_class_archive(with_compiler(settings), find_java())


def _finished(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command``, then its JVM's class archive moved in if it recorded one (driver, once)."""

    def run(args: argparse.Namespace) -> int:
        from spark_elastic.runtime.container.class_archive import finish, gateway_process

        try:
            return command(args)
        finally:
            finish(gateway_process())

    return run
