"""``spark-elastic checkpoint show`` and ``spark-elastic rescale``: stateful checkpoints."""

from __future__ import annotations

import argparse
import json
import sys
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
    show.set_defaults(run=run_show)

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
    rescale.set_defaults(run=run_rescale)


def run_show(args: argparse.Namespace) -> int:
    """Print the checkpoint report."""
    from spark_elastic.state.checkpoint_dir import require_job
    from spark_elastic.state.show import format_report, read_checkpoint

    require_job(args.checkpoint)  # fail fast, before starting Spark
    report = read_checkpoint(args.checkpoint, _spark())
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_report(report))
    return 0


def run_rescale(args: argparse.Namespace) -> int:
    """Rescale, after every check that needs no Spark has passed."""
    from spark_elastic.model.names import validate_elasticity_factor
    from spark_elastic.state.checkpoint_dir import checkpoint_path
    from spark_elastic.state.rescale import _check_target, rescale, stopped_source

    validate_elasticity_factor(args.elasticity_factor)
    _check_target(
        checkpoint_path(args.target, "--to"), [checkpoint_path(s, "--from") for s in args.sources]
    )
    for source in args.sources:
        stopped_source(source)
    result = rescale(args.sources, args.target, args.elasticity_factor, _spark())
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


def _spark() -> Any:
    """A local session whose Spark logs only errors, from its very start (driver, once)."""
    from pathlib import Path

    from spark_elastic.dataplane.session import local_session

    quiet = Path(__file__).with_name("quiet-log4j2.properties")
    options = f"-Xss16m -Dlog4j2.configurationFile={quiet.as_uri()}"
    return local_session("spark-elastic-cli", conf={"spark.driver.extraJavaOptions": options})
