"""Durable files under one write discipline (``storage.disk``), for the quorum, snapshots and the broker."""
