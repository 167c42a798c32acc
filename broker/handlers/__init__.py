"""The broker's Kafka API handlers, grouped by concern.  Each is a function ``(server, request) -> body``
reaching the broker's state through the server it is given (``context.BrokerContext``: what they use of
``broker.frontend.BrokerServer``); ``broker.api_table`` names them.

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
