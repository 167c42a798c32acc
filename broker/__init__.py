"""Broker-side components of pidquorum: what a Kafka-compatible broker runs next to the quorum."""
