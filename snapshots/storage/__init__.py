"""Durable files under one write discipline (``snapshots.storage.disk``), for the quorum, snapshots and the broker."""
