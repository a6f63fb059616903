"""``spark-elastic container run``: what the coordinator launches, usable by hand.

Reads its settings from the environment (``EXECUTION_ENV_CONTAINER_ID``,
``SPARK_ELASTIC_COORDINATOR_URL``, ``SPARK_ELASTIC_JOB``, ...; see
:mod:`spark_elastic.runtime.container.settings`). Exit codes: 0 stopped, 1 fenced or
failed (Samza's), 2 a configuration mistake (one line, no traceback).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``container run`` to the CLI."""
    parser = subparsers.add_parser(
        "container",
        help="run a container of a job (launched by the coordinator)",
        description="Run one container of a job under its coordinator.",
    )
    commands = parser.add_subparsers(dest="container_command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "run",
        help="run the container named by EXECUTION_ENV_CONTAINER_ID",
        description=(
            "Run the container the coordinator issued as EXECUTION_ENV_CONTAINER_ID for the job "
            "SPARK_ELASTIC_JOB, reporting to SPARK_ELASTIC_COORDINATOR_URL."
        ),
    )
    run.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from spark_elastic.runtime.container import ContainerSettings, run_container

    return run_container(ContainerSettings.from_env())
