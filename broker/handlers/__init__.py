"""The broker's Kafka API handlers, grouped by concern.  Each is a function ``(server, request) -> body``
reaching the broker's state through the ``BrokerServer`` it is given; ``broker.api_table`` names them.

================  ==========================================================================
module            APIs
================  ==========================================================================
``metadata``      ApiVersions, Metadata, FindCoordinator
``producer_ids``  InitProducerId
``partitions``    Produce, Fetch, ListOffsets, DescribeProducers
``transactions``  AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, ListTransactions,
                  DescribeTransactions
================  ==========================================================================
"""
