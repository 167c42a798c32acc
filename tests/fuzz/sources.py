"""What every fuzz input generator shares: the hypothesis profiles and example counts, the memory bound a decoder
runs under, the two sources values are drawn from, and FuzzFinding, which a broken decoder property raises."""
from __future__ import annotations

import os


# ------------------------------------------------------- hypothesis settings

SCALE_ENV = "PIDQUORUM_FUZZ_SCALE"  # multiplies every example count (default 1)
PROFILE_ENV = "PIDQUORUM_HYPOTHESIS_PROFILE"  # "pidquorum-ci" (default) or "pidquorum-explore"


def load_hypothesis_profile() -> None:
    """Reproducible by default (derandomized, no example database): the same inputs on every
    run and in CI.  ``PIDQUORUM_HYPOTHESIS_PROFILE=pidquorum-explore`` draws new ones each run."""
    from hypothesis import HealthCheck, settings

    common = dict(deadline=None, print_blob=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.function_scoped_fixture])
    settings.register_profile("pidquorum-ci", derandomize=True, database=None, **common)
    settings.register_profile("pidquorum-explore", derandomize=False, **common)
    settings.load_profile(os.environ.get(PROFILE_ENV, "pidquorum-ci"))


def examples(n: int) -> int:
    return max(1, int(n * float(os.environ.get(SCALE_ENV, "1"))))


# ------------------------------------------------------------ memory bound

HEADROOM = 2 * 1024**3  # address space a decoder may take beyond what the process has in use


def vm_size() -> int:
    """The address space this process has in use (VmSize), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0  # pragma: no cover


# ------------------------------------------------------------------ sources


class RandomSource:
    """Draws from a seeded ``random.Random``, biased towards edge values."""

    def __init__(self, rng):
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        r = self.rng.random()
        if r < 0.25:
            edges = [v for v in (lo, hi, 0, 1, -1, lo + 1, hi - 1) if lo <= v <= hi]
            return self.rng.choice(edges)
        if r < 0.6:
            small = max(lo, -300), min(hi, 300)
            if small[0] <= small[1]:
                return self.rng.randint(*small)
        return self.rng.randint(lo, hi)

    def boolean(self, p_true: float = 0.5) -> bool:
        return self.rng.random() < p_true

    def choice(self, seq):
        return seq[self.rng.randrange(len(seq))]

    def binary(self, max_len: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, max_len))

    def text(self, max_len: int) -> str:
        n = self.rng.randint(0, max_len)
        alphabet = "abcXYZ019-_.:/ é€😀\x00"
        return "".join(self.rng.choice(alphabet) for _ in range(n))


class HypothesisSource:
    """Draws through a hypothesis ``data`` object (``st.data()``), so failures shrink."""

    def __init__(self, data):
        from hypothesis import strategies as st

        self.data, self.st = data, st

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))

    def boolean(self, p_true: float = 0.5) -> bool:
        return self.data.draw(self.st.booleans())

    def choice(self, seq):
        return self.data.draw(self.st.sampled_from(list(seq)))

    def binary(self, max_len: int) -> bytes:
        return self.data.draw(self.st.binary(max_size=max_len))

    def text(self, max_len: int) -> str:
        return self.data.draw(self.st.text(max_size=max_len))


# ------------------------------------------------------------ the properties


class FuzzFinding(AssertionError):
    """A decoder broke its contract on one input (the input is kept for reproduction)."""

    def __init__(self, target: str, data: bytes, problem: str):
        super().__init__(f"{target}: {problem} (input {data[:200].hex()}{'...' if len(data) > 200 else ''})")
        self.target, self.data, self.problem = target, data, problem
