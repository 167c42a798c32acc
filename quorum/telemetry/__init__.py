"""Logs and the metrics endpoint, shared by every pidquorum process."""
