"""Prometheus figures as a test reads them."""
from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families


def samples(registry) -> dict:
    """Every sample ``registry`` exposes, parsed back from its text format: (name, sorted labels) -> value."""
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out
