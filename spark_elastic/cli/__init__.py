"""The ``spark-elastic`` command line: one parser, one module per command.

Owns :mod:`.main` (the parser, error-to-exit-code mapping) and the commands
:mod:`.plan`, :mod:`.assign`, :mod:`.log` and :mod:`.checkpoint`.

May import: every other package; nothing imports it. Commands import what they
need when they run, so ``plan`` and ``assign`` never load pyspark.
"""
