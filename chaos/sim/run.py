"""One seed's simulation with the workload its config names: producer IDs (``Simulation``) or
transactions (``TxnSimulation``, built on it)."""
from __future__ import annotations

from .sim import SimConfig, SimResult, Simulation
from .txn import TxnSimulation


def make_simulation(config: SimConfig) -> Simulation:
    if config.workload == "transactions":
        return TxnSimulation(config)
    if config.workload != "pids":
        raise ValueError(f"unknown workload {config.workload!r} (pids, transactions)")
    return Simulation(config)


def simulate(seed: int, steps: int = 6000, nodes: int = 3, faults: bool = True, workload: str = "pids") -> SimResult:
    return make_simulation(SimConfig(seed=seed, steps=steps, nodes=nodes, faults=faults, workload=workload)).run()


__all__ = ["make_simulation", "simulate"]
