"""``python -m spark_elastic``: the same as the ``spark-elastic`` command."""

import sys

from spark_elastic.cli.main import main

sys.exit(main())
