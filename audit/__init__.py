"""The audit pipeline: the quorum's audit trails and chaos histories as typed Parquet
(``audit.export``, ``pidctl audit export``), checked for overlaps and abnormal brokers on Spark.

The job: ``audit.inputs`` reads and checks the export, ``audit.checks`` runs the checks
(spread over cores by ``audit.buckets``), ``audit.job`` runs it all (``run_audit``),
``audit.report`` renders the report and ``audit.spark`` starts Spark.  ``audit.export``
(pyarrow), ``audit.checks`` and ``audit.buckets`` (pyspark) import their heavy dependency at
the top and are imported only when used; the other modules defer theirs to the functions
that need them, so ``pidctl`` starts without pyspark, pyarrow, numpy or matplotlib.
"""
