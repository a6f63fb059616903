"""``spark-elastic plan``: print (and optionally save) the task plan of a job."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from spark_elastic.model.groupers import plan_job
from spark_elastic.model.plan import Grouper, JobPlan, StreamInput, load_plan_json, write_plan_json

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    """Add the ``plan`` subcommand."""
    parser = subparsers.add_parser(
        "plan",
        help="print the tasks and virtual tasks of a job",
        description=(
            "Group a job's input partitions into tasks (Samza's groupers, SAMZA-71 cogroup), "
            "split them into virtual tasks (SEP-32) and keep grown streams on their tasks (SEP-5)."
        ),
    )
    parser.add_argument(
        "--input",
        dest="inputs",
        action="append",
        required=True,
        metavar="SYSTEM.STREAM:PARTITIONS",
        help="an input stream and its partition count, e.g. kafka.PVE:8 (repeatable, in order)",
    )
    parser.add_argument(
        "--grouper",
        choices=[g.value for g in Grouper],
        default=Grouper.PARTITION.value,
        help="how partitions are grouped into tasks (default: partition)",
    )
    parser.add_argument(
        "--elasticity-factor",
        type=int,
        default=1,
        metavar="N",
        help="virtual tasks per task: a power of two from 1 to 1024 (default: 1)",
    )
    parser.add_argument(
        "--previous",
        metavar="FILE",
        help="the job's previous plan (a --json or --save output): grown streams keep their tasks",
    )
    parser.add_argument(
        "--save",
        metavar="FILE",
        help="also write the plan as JSON to FILE, atomically (it may be the --previous file)",
    )
    parser.add_argument(
        "--processor",
        dest="processors",
        action="append",
        default=[],
        metavar="NAME",
        help="a processor of the single-task grouper (repeatable; default: one named 0)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Make the plan, print it, save it when asked."""
    previous = None if args.previous is None else load_plan_json(args.previous)
    plan = plan_job(
        [StreamInput.parse(text) for text in args.inputs],
        grouper=args.grouper,
        elasticity_factor=args.elasticity_factor,
        previous=previous,
        processors=args.processors,
    )
    if args.save is not None:
        # Errors name the option, not the API's argument: the user typed --save.
        write_plan_json(plan, args.save, "--save")
    if args.json:
        json.dump(plan.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        write_table(plan, sys.stdout)
    return 0


def write_table(plan: JobPlan, out: TextIO) -> None:
    """A readable table: one row per task, its partitions comma-separated."""
    inputs = ", ".join(str(s) for s in plan.inputs)
    out.write(
        f"{plan.task_count} tasks from {plan.partition_count} stream partitions "
        f"({inputs}); grouper {plan.grouper.value}, elasticity factor {plan.elasticity_factor}\n"
    )
    rows = [
        (str(task.id), str(task.name), ", ".join(_short(p) for p in task.partitions))
        for task in plan.tasks
    ]
    id_width = max([len("ID"), *(len(r[0]) for r in rows)])
    name_width = max([len("TASK"), *(len(r[1]) for r in rows)])
    out.write(f"{'ID':>{id_width}}  {'TASK':<{name_width}}  PARTITIONS\n")
    for task_id, name, partitions in rows:
        out.write(f"{task_id:>{id_width}}  {name:<{name_width}}  {partitions}\n")


def _short(ssp: Any) -> str:
    bucket = "" if ssp.key_bucket is None else f"#{ssp.key_bucket}"
    return f"{ssp.system}.{ssp.stream}:{ssp.partition}{bucket}"
