"""Snapshots: the latest block plus live registrations, as records, msgpack, checksummed."""
from .format import Snapshot, inspect_snapshot, read_snapshot, write_snapshot  # noqa: F401
