"""The three-node Raft quorum that allocates producer-ID blocks (KIP-730)."""
