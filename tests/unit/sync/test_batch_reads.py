"""Both clusters' partly acked batches for the sync (cursorsync.sync.batch_reads), asked of
stub brokers: the source's go into the plan, the target's say what not to send again."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from cursorsync.core.batches import PartialBatch
from cursorsync.core.positions import Position
from cursorsync.errors import ConfigError
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.batch_acks import PLUGIN_PATH
from cursorsync.sync.batch_reads import BatchReads
from tests.support.admin_stub import Reply, StubAdmin
from tests.unit.pulsar.test_batch_acks import entry

T = "persistent://acme/orders/events-partition-0"
S = "svc"


def answer(*entries: dict[str, Any], kept: bool = True) -> dict[str, Any]:
    return {"plugin": "cursorsync", "topic": T, "subscription": S, "markDeletePosition": "1:-1",
            "batchIndexAcks": kept, "entries": list(entries), "truncated": False}


@pytest.fixture
def stubs() -> Iterator[tuple[StubAdmin, StubAdmin]]:
    a, b = StubAdmin().start(), StubAdmin().start()
    yield a, b
    a.stop()
    b.stop()


def _admin(stub: StubAdmin, cluster: str) -> AdminClient:
    return AdminClient(AdminSettings.from_urls(stub.url, cluster=cluster, attempts=1,
                                               timeout_s=2.0))


PATH = f"{PLUGIN_PATH}?{urlencode({'topic': T, 'subscription': S})}"
MARK = {"plugin": "cursorsync", "error": "not found"}


def test_the_sources_batches_and_what_the_target_holds(stubs: tuple[StubAdmin, StubAdmin]
                                                        ) -> None:
    a, b = stubs
    a.set(PATH, Reply(body=answer(entry("1:2", 4, {0, 3}), entry("1:5", 2, {1}))))
    b.set(PATH, Reply(body=answer(entry("7:2", 4, {0}))))
    with _admin(a, "a") as source, _admin(b, "b") as target:
        got = BatchReads(source, target).many([(T, S)])[T, S]
    assert got.source == (PartialBatch(Position(1, 2), 4, frozenset({0, 3})),
                          PartialBatch(Position(1, 5), 2, frozenset({1})))
    assert got.target == {Position(7, 2): PartialBatch(Position(7, 2), 4, frozenset({0}))}


def test_a_source_without_the_plugin_is_a_config_error_naming_it(
        stubs: tuple[StubAdmin, StubAdmin]) -> None:
    a, b = stubs  # a answers 404 without the plugin's mark: no plugin
    with _admin(a, "a") as source, _admin(b, "b") as target, pytest.raises(
            ConfigError, match="broker plugin on the source cluster a"):
        BatchReads(source, target).many([(T, S)])


def test_a_target_without_the_plugin_is_unknown_and_asked_no_more(
        stubs: tuple[StubAdmin, StubAdmin]) -> None:
    a, b = stubs
    a.set(PATH, Reply(body=answer(entry("1:2", 4, {0}))))
    with _admin(a, "a") as source, _admin(b, "b") as target:
        reads = BatchReads(source, target)
        first = reads.many([(T, S)])[T, S]
        asked = len(b.requests)
        second = reads.many([(T, S)])[T, S]
    assert first.target is None and second.target is None and first.source
    assert asked == 1 and len(b.requests) == 1


def test_a_target_keeping_no_batch_indexes_gets_nothing_planned(
        stubs: tuple[StubAdmin, StubAdmin]) -> None:
    a, b = stubs
    a.set(PATH, Reply(body=answer(entry("1:2", 4, {0}))))
    b.set(PATH, Reply(body=answer(kept=False)))
    with _admin(a, "a") as source, _admin(b, "b") as target:
        got = BatchReads(source, target).many([(T, S)])[T, S]
    assert got.source == () and not got.target_keeps


def test_a_subscription_gone_from_the_source_is_left_out(
        stubs: tuple[StubAdmin, StubAdmin]) -> None:
    a, b = stubs
    a.set(PATH, Reply(404, MARK))
    with _admin(a, "a") as source, _admin(b, "b") as target:
        assert BatchReads(source, target).many([(T, S)]) == {}
