"""The Kafka wire, below every server: framing, bounded parsing, encoding, error codes.

Imports nothing of pidquorum but ``records``; the quorum, the broker and the SASL
gate each keep their own API table (``records.wire.kafka.ApiTable``).
"""
