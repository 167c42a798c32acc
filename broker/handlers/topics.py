"""Topic administration: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs."""
from __future__ import annotations

from .rpc import BrokerRpc

RPCS: dict[int, BrokerRpc] = {}
