"""A real broker answers the allocator stats the direct memory watch reads."""

from __future__ import annotations

import pytest

from cursorsync_devtools.testbed import TestBed
from cursorsync_devtools.testbed.direct_memory import DirectMemoryWatch

pytestmark = pytest.mark.integration


def test_every_broker_of_the_bed_reports_its_pooled_direct_memory(testbed: TestBed) -> None:
    watch = DirectMemoryWatch({name: testbed.admin_url(name) for name in testbed.clusters})
    watch.read()
    peaks = watch.peaks()
    assert set(peaks) == set(testbed.clusters)
    # A running broker holds at least one chunk of its pool (4 MB each by default).
    assert all(mb is not None and mb >= 1 for mb in peaks.values()), peaks
