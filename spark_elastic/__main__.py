"""``python -m spark_elastic``: the same as the ``spark-elastic`` command."""

import sys

from spark_elastic._cli import main

sys.exit(main())
