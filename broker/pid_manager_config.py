"""How ``broker.pid_manager.ProducerIdManager`` is tuned (the ``[pid_manager]`` table of a broker's file), and the
heartbeat interval it keeps the broker's registration alive with."""
from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from pydantic import Field, model_validator

from quorum import settings

# Kafka's broker.heartbeat.interval.ms.
DEFAULT_BROKER_HEARTBEAT_INTERVAL_MS = 2000
# The quorum's default broker_session_timeout_ms (quorum.managers.DEFAULT_BROKER_SESSION_TIMEOUT_MS; the broker
# does not import the quorum): heartbeats must come more often than this.
QUORUM_BROKER_SESSION_TIMEOUT_MS = 9000


@settings.model
class PidManagerConfig:
    """Tuning of ``ProducerIdManager``.  Times in seconds.  (The ``[pid_manager]`` table of a broker's file.)"""

    prefetch_threshold: Annotated[float, Field(ge=0, lt=1)] = 0.9
    """Fraction of a block used before the next one is asked for (Kafka: 0.9); the reserve
    never falls below ``1 - prefetch_threshold`` of a block."""
    adaptive: bool = True
    """Size the reserve from the measured demand; False = Kafka's fixed threshold only."""
    failover_budget_s: Annotated[float, Field(ge=0)] = 2.0
    """How long the quorum may give no block (worst observed leader failover plus margin)."""
    learn_failover_budget: bool = True
    """Raise the budget to ``outage_margin`` x the longest recent wait for a block."""
    outage_margin: Annotated[float, Field(ge=0)] = 1.5
    """The learned budget is this many times the longest recent wait for a block."""
    outage_memory_s: Annotated[float, Field(ge=0)] = 600.0
    """A long wait counts towards the learned budget for this long."""
    max_prefetch_blocks: Annotated[int, Field(ge=1)] = 64
    """Cap on the blocks queued behind the current one."""
    backoff_initial_s: Annotated[float, Field(gt=0)] = 0.05
    """First delay before asking the quorum again after a failed request."""
    backoff_max_s: float = 5.0
    """Longest delay between two requests to the quorum."""
    backoff_jitter: Annotated[float, Field(ge=0, lt=1)] = 0.2
    """Each delay is multiplied by a random factor in [1 - jitter, 1 + jitter]."""
    start_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """How long starting may wait for the broker's registration and first block."""
    rate_window_s: Annotated[float, Field(gt=0)] = 0.25
    """Length of one demand-measurement window."""
    rate_ewma_alpha: Annotated[float, Field(gt=0, le=1)] = 0.3
    """Weight of the newest window in the demand estimate."""
    rate_peak_windows: Annotated[int, Field(ge=1)] = 40
    """The peak of this many recent windows also bounds the rate estimate from below."""
    latency_ewma_alpha: Annotated[float, Field(gt=0, le=1)] = 0.2
    """Weight of the newest block request in the latency estimate."""
    @model_validator(mode="after")
    def _check(self) -> "PidManagerConfig":
        if self.backoff_initial_s > self.backoff_max_s:
            raise ValueError("need 0 < backoff_initial_s <= backoff_max_s")
        return self

    @classmethod
    def kafka_fixed_threshold(cls, **overrides) -> "PidManagerConfig":
        """Kafka's behaviour: one block in reserve, asked for at 90 % use, no demand sizing."""
        return replace(cls(adaptive=False, failover_budget_s=0.0, learn_failover_budget=False,
                           max_prefetch_blocks=1, prefetch_threshold=0.9), **overrides)
