"""Talking to a quorum on the Kafka wire: ``quorum.client.quorum`` (QuorumClient, its retry policy and connections),
used by brokers, the CLI, migration, chaos runs and benchmarks, and by followers forwarding to the leader."""
