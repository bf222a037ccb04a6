"""Reading one sample back from the metrics' exposition text."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from cursorsync.app.metrics import Metrics


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    """The value of one sample in the exposition text, or None if absent."""
    for family in text_string_to_metric_families(metrics.exposition()):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None
