"""Fixtures of the pulsar-entries tests on the test bed (several modules read the same topics)."""

from __future__ import annotations

import uuid

import pytest

from cursorsync_devtools.testbed import TestBed
from tests.support.entries import client_of, local_topic, produce


@pytest.fixture(scope="module")
def topics(testbed: TestBed) -> list[str]:
    """Two partitions on a: 3 unbatched entries and batches of 4 and 1; 2 and a batch of 3."""
    names = local_topic(testbed, "a", f"orders-{uuid.uuid4().hex[:8]}", partitions=2)
    client = client_of(testbed, "a")
    produce(client, names[0], unbatched=3, batches=[4, 1], tag="0")
    produce(client, names[1], unbatched=2, batches=[3], tag="1")
    return names
