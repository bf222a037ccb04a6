"""A sync batch's target cursors, read together, on the admin stub (a broker that is slow
or fails for one topic); what Pulsar answers: tests/integration/sync/test_target_reads.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest

from cursorsync.errors import AdminUnavailableError
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.cursor_digests import CURSORS_PATH
from cursorsync.pulsar.topics import TopicName
from cursorsync.sync.target_reads import AdminTargets
from tests.support.admin_stub import Reply, StubAdmin, plugin_listing, stats_doc


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


def test_with_the_plugin_one_request_reads_the_cursors_it_answers_for(stub: StubAdmin) -> None:
    """``spark.cursor_digests``: the target brokers' plugin answers for t0 with both synced
    subscriptions; t1 lacks one there and t2 is not listed (being moved), so those two are
    read on their own. One plugin request and two internalStats, each cursor from where it
    was read."""
    ns = "acme/orders"
    t0, t1, t2 = (f"persistent://{ns}/t{i}" for i in range(3))
    broker = urlsplit(stub.url).netloc

    def doc(cursors: dict[str, str]) -> dict[str, Any]:
        return stats_doc("3:9", [(1, 5), (3, 0)], {s: (md, "[]") for s, md in cursors.items()})

    query = urlencode([("namespace", ns), ("subscription", "audit"), ("subscription", "svc"),
                       ("stats", "true")])
    stub.set(f"{CURSORS_PATH}?{query}", Reply(body=plugin_listing(broker, ns, {
        t0: doc({"audit": "3:1", "svc": "3:2"}), t1: doc({"svc": "3:3"})})))
    for name in (t1, t2):
        stub.set(TopicName.parse(name).admin_path("internalStats"), Reply(body=stats_doc(
            "3:9", [(1, 5), (3, 0)], {"svc": ("1:4", "[]"), "audit": ("1:3", "[]")})))
    with AdminClient(AdminSettings.from_urls(stub.url, attempts=1)) as admin:
        targets = AdminTargets(admin, plugin=True)
        got = targets.many([(t0, "svc"), (t0, "audit"), (t1, "svc"), (t1, "audit"),
                            (t2, "svc")])
    assert {k: str(v.mark_delete) for k, v in got.items()} == {  # type: ignore[union-attr]
        (t0, "svc"): "3:2", (t0, "audit"): "3:1", (t1, "svc"): "1:4", (t1, "audit"): "1:3",
        (t2, "svc"): "1:4"}
    assert targets.requests == 2 and targets.plugin.reads == 1
    assert sorted(p.split("?")[0] for p, _ in stub.requests) == sorted(
        [CURSORS_PATH, *(TopicName.parse(t).admin_path("internalStats") for t in (t1, t2))])
