"""The main example: plan a clickstream job's tasks and virtual tasks.

Run with ``make example`` (see README). Two input streams, page views with
8 partitions and user events with 4, grouped by partition and split into
virtual tasks at elasticity factor 2.
"""

from __future__ import annotations

import sys

from spark_elastic import plan_job
from spark_elastic._cli_plan import write_table


def main() -> int:
    plan = plan_job(["kafka.PageViews:8", "kafka.UserEvents:4"], "partition", elasticity_factor=2)
    write_table(plan, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
