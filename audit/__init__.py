"""The audit pipeline: the quorum's audit trails and chaos histories as typed Parquet
(``audit.export``, ``pidctl audit export``), checked for overlaps and abnormal brokers on Spark."""
