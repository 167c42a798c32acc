"""Migration from ZooKeeper-based producer-ID allocation to the quorum (KIP-730 style)."""
