"""A sync batch's target cursors, read together, on the admin stub (a broker that is slow
or fails for one topic); what Pulsar answers: tests/integration/sync/test_target_reads.py."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from cursorsync.errors import AdminUnavailableError
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.topics import TopicName
from cursorsync.sync.target_reads import AdminTargets
from tests.support.admin_stub import Reply, StubAdmin, stats_doc


@pytest.fixture
def stub() -> Iterator[StubAdmin]:
    s = StubAdmin().start()
    yield s
    s.stop()


def test_reads_go_out_together_and_a_failing_topic_fails_only_its_own(
        stub: StubAdmin) -> None:
    """Twelve topics answering in 0.2 s each are read in much less than 12 x 0.2 s; a topic
    whose broker keeps failing gets its error, and the others their cursors."""
    names = [f"persistent://acme/orders/t{i}" for i in range(12)]
    doc = stats_doc("3:9", [(1, 5), (3, 0)], {"svc": ("1:4", "[]")})
    for n in names[1:]:
        stub.set(TopicName.parse(n).admin_path("internalStats"), Reply(body=doc, delay_s=0.2))
    stub.set(TopicName.parse(names[0]).admin_path("internalStats"), Reply(503, {}))
    config = AdminSettings.from_urls(stub.url, attempts=2, backoff_initial_s=0.01,
                                   backoff_max_s=0.02, max_workers=8)
    with AdminClient(config) as admin:
        t0 = time.monotonic()
        got = AdminTargets(admin).many([(n, "svc") for n in names])
        took = time.monotonic() - t0
    assert isinstance(got[names[0], "svc"], AdminUnavailableError)
    assert all(str(got[n, "svc"].mark_delete) == "1:4" for n in names[1:])  # type: ignore[union-attr]
    assert took < 6 * 0.2, took  # 8 at a time: two rounds, not twelve


def test_one_at_a_time_raises_what_the_broker_gave(stub: StubAdmin) -> None:
    name = "persistent://acme/orders/t0"
    stub.set(TopicName.parse(name).admin_path("internalStats"), Reply(503, {}))
    with (AdminClient(AdminSettings.from_urls(stub.url, attempts=1)) as admin,
          pytest.raises(AdminUnavailableError, match="t0")):
        AdminTargets(admin)(name, "svc")
