"""The ``spark-elastic`` command line: one subcommand per module, dispatched here.

Each subcommand module exposes ``register(subparsers)``, which adds its
parser and sets ``run`` (``argparse.Namespace -> int``) as its handler.
User mistakes (bad arguments, :class:`~spark_elastic.errors.SparkElasticError`)
print one line to stderr and exit 2; there is no traceback for them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from spark_elastic.errors import SparkElasticError

__all__ = ["main"]

EXIT_USAGE = 2

# Subcommand modules, imported only to register their parsers; each keeps its own heavy
# imports inside its handler so `spark-elastic plan` starts fast.
_SUBCOMMANDS = (
    "spark_elastic.cli.plan",
    "spark_elastic.cli.assign",
    "spark_elastic.cli.log",
    "spark_elastic.cli.checkpoint",
    "spark_elastic.cli.container",
    "spark_elastic.cli.job",
)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The full parser with every available subcommand."""
    parser = _Parser(
        prog="spark-elastic",
        description="Samza-style virtual tasks and task assignment for Spark Structured Streaming.",
    )
    from spark_elastic import __version__

    parser.add_argument("--version", action="version", version=f"spark-elastic {__version__}")
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_Parser
    )
    for name in _SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
    except SparkElasticError as exc:
        print(f"spark-elastic {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # `spark-elastic plan ... | head`: the reader left; not an error of ours.
        sys.stderr.close()
        return 0
    except OSError as exc:
        # A path the user gave that cannot be read or written: their mistake to fix,
        # told in one line like any other (the subcommands wrap the ones they expect).
        print(f"spark-elastic {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
