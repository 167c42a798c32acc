"""The audit pipeline: the quorum's audit trails and chaos histories as typed Parquet
(``chaos.audit.export``, ``pidctl audit export``), checked for overlaps and abnormal brokers on Spark.

The job: ``chaos.audit.inputs`` reads and checks the export, ``chaos.audit.checks`` runs the checks
(spread over cores by ``chaos.audit.buckets``), ``chaos.audit.job`` runs it all (``run_audit``),
``chaos.audit.report`` renders the report and ``chaos.audit.spark`` starts Spark.  ``chaos.audit.export``
(pyarrow), ``chaos.audit.checks`` and ``chaos.audit.buckets`` (pyspark) import their heavy dependency at
the top and are imported only when used; the other modules defer theirs to the functions
that need them, so ``pidctl`` starts without pyspark, pyarrow, numpy or matplotlib.
"""
