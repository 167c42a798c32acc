"""The Kafka API keys the broker serves, and protocol values its handlers share."""
from __future__ import annotations

PRODUCE, FETCH, LIST_OFFSETS, METADATA, FIND_COORDINATOR, INIT_PRODUCER_ID = 0, 1, 2, 3, 10, 22
DESCRIBE_PRODUCERS = 61
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN = 24, 25, 26
