"""A real broker reports its direct memory where the watch reads it, in a light answer once
topic-level metrics are off."""

from __future__ import annotations

import httpx
import pytest

from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.direct_memory import METRICS, DirectMemoryWatch

pytestmark = pytest.mark.integration


def test_every_broker_of_the_bed_reports_its_direct_memory(testbed: TestBed) -> None:
    watch = DirectMemoryWatch({name: testbed.admin_url(name) for name in testbed.clusters})
    watch.read()
    peaks = watch.peaks()
    assert set(peaks) == set(testbed.clusters)
    # A running broker holds its pools' first chunks at least (4 MB each).
    assert all(mb is not None and mb >= 4 for mb in peaks.values()), peaks
    text = httpx.get(testbed.admin_url("a") + METRICS, timeout=30).text
    assert "jvm_memory_direct_bytes_max" in text
