"""Consumer groups (classic protocol) and their committed offsets."""
from __future__ import annotations

from .rpc import BrokerRpc

RPCS: dict[int, BrokerRpc] = {}
