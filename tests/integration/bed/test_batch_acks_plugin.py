"""cursorsync's broker plugin (streaming/broker-plugin) loaded into real Pulsar 4.0.8 brokers:
its batch-acks endpoint names exactly the acked indexes the source broker holds of each
partially acked batch (issue 38), read through :mod:`cursorsync.pulsar.batch_acks`; its
cursors endpoint tells which partitions' cursors or ledgers changed, batch-index acks
included (:mod:`cursorsync.pulsar.cursor_digests`).

Each claim is checked against the broker's own behaviour too: a consumer that reconnects
is sent again exactly the messages the plugin does not name as acked.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from cursorsync.core.positions import Position, parse_range_bounds
from cursorsync.pulsar.admin import AdminClient, AdminSettings
from cursorsync.pulsar.batch_acks import (
    BatchAcks,
    BatchAcksNotFoundError,
    BatchAcksPluginAbsentError,
    fetch_batch_acks,
    fetch_every_batch,
)
from cursorsync.pulsar.cursor_digests import (
    TopicDigest,
    acks_digest,
    fetch_cursor_digests,
    moved,
)
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed import (
    BROKER_PLUGIN_BUILD,
    TestBed,
    TestBedConfig,
    TestBedError,
    broker_plugin_path,
)
from tests.support.entries import send_batches

pytestmark = pytest.mark.integration

BATCH = 5
BATCHES = 12


@pytest.fixture(scope="module")
def plugin_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBed]:
    """The plugin in both brokers; a keeps batch indexes, b does not (Pulsar 4.0's default)."""
    on = {"acknowledgmentAtBatchIndexLevelEnabled": "true"}
    config = TestBedConfig(work_dir=tmp_path_factory.mktemp("batch-acks-plugin"),
                           settings={"a": on}, broker_plugin=broker_plugin_path())
    with TestBed(config) as bed:
        yield bed


def _admin(bed: TestBed, cluster: str) -> AdminClient:
    return AdminClient(AdminSettings.from_urls(bed.admin_url(cluster), cluster=cluster))


def _ask(bed: TestBed, cluster: str, topic: str, **kw: Any) -> BatchAcks:
    with _admin(bed, cluster) as admin:
        return fetch_batch_acks(admin, topic, "s", **kw)


Acked = dict[str, dict[Position, frozenset[int]]]


def _batched(client: Any, parts: list[str], per_part: int, prefix: str = "m") -> None:
    """``per_part`` messages to each partition, in batches of BATCH (one producer each)."""
    for part in parts:
        send_batches(client, part, per_part, BATCH, prefix)


def _partly_acked(bed: TestBed, name: str, parts: list[str], seed: int
                  ) -> tuple[Any, Acked, dict[str, dict[Position, int]]]:
    """BATCHES batches of BATCH on a, spread over the topic's partitions (a producer on each,
    so every batch is whole), every message received by a batch-index-ack consumer of the
    topic, and of each batch none, all or a random part acked (each of the three at least
    once). Returns the consumer (open), the acked indexes of each partly acked batch by
    partition, and every batch's size by partition."""
    rng = random.Random(seed)
    client = bed.client("a")
    consumer = client.subscribe(bed.topic(name), "s", consumer_type=pulsar.ConsumerType.Shared,
                                batch_index_ack_enabled=True)
    _batched(client, parts, BATCH * BATCHES // len(parts))
    by_entry: dict[tuple[str, Position], list[Any]] = {}
    for _ in range(BATCH * BATCHES):
        m = consumer.receive(10_000)
        mid = m.message_id()
        by_entry.setdefault((m.topic_name(), Position(mid.ledger_id(), mid.entry_id())),
                            []).append(m)
    want: Acked = {}
    sizes: dict[str, dict[Position, int]] = {}
    for n, ((part, pos), msgs) in enumerate(sorted(by_entry.items())):
        sizes.setdefault(part, {})[pos] = len(msgs)
        mode = ("none", "all", "part")[n] if n < 3 else rng.choice(("none", "all", "part"))
        if mode == "none":
            continue
        chosen = msgs if mode == "all" else rng.sample(msgs, rng.randint(1, len(msgs) - 1))
        for m in chosen:
            consumer.acknowledge(m)
        if mode == "part":
            want.setdefault(part, {})[pos] = frozenset(
                m.message_id().batch_index() for m in chosen)
    assert sorted(len(m) for m in by_entry.values()) == [BATCH] * BATCHES, sizes
    return consumer, want, sizes


def _settled(bed: TestBed, topics: list[str], want: Acked) -> dict[str, BatchAcks]:
    """The plugin's answers once they name what was acked (acks reach the broker a little
    after acknowledge() returns), or as they stand at the deadline."""
    deadline = time.monotonic() + 15
    while True:
        got = {t: _ask(bed, "a", t) for t in topics}
        if all(got[t].acked == want.get(t, {}) for t in topics) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def _redelivered(bed: TestBed, name: str) -> dict[str, dict[Position, set[int]]]:
    """What a consumer that subscribes again is sent, by partition and entry."""
    consumer = bed.client("a").subscribe(bed.topic(name), "s",
                                         consumer_type=pulsar.ConsumerType.Shared,
                                         batch_index_ack_enabled=True)
    out: dict[str, dict[Position, set[int]]] = {}
    try:
        while True:
            m = consumer.receive(3000)
            mid = m.message_id()
            out.setdefault(m.topic_name(), {}).setdefault(
                Position(mid.ledger_id(), mid.entry_id()), set()).add(mid.batch_index())
    except pulsar.Timeout:
        pass
    finally:
        consumer.close()
    return out


def _unacked(answers: dict[str, BatchAcks], sizes: dict[str, dict[Position, int]],
             redelivered: dict[str, dict[Position, set[int]]]) -> None:
    """Every partly acked batch the plugin names is sent again without its acked indexes."""
    for part, answer in answers.items():
        for pos, acked in answer.acked.items():
            assert redelivered[part][pos] == set(range(sizes[part][pos])) - acked, (part, pos)


@pytest.mark.slow  # a test bed of its own: CURSORSYNC_SLOW=1 runs it
def test_the_plugin_names_exactly_the_acked_indexes_of_each_partly_acked_batch(
        plugin_bed: TestBed) -> None:
    bed = plugin_bed
    name = "partly-acked"
    parts = bed.create_topic(name, partitions=2)
    consumer, want, sizes = _partly_acked(bed, name, parts, seed=38)
    got = _settled(bed, parts, want)
    for part in parts:
        answer = got[part]
        assert answer.batch_index_acks and not answer.truncated
        # Exactly the partly acked batches, each with exactly its acked indexes: nothing
        # for the wholly acked or wholly unacked ones.
        assert answer.acked == want.get(part, {}), part
        assert {b.size for b in answer.batches} <= {BATCH}
        cursor = bed.internal_stats("a", part)["cursors"]["s"]
        assert str(answer.mark_delete) == cursor["markDeletePosition"]
    # A limit cuts the answer and says so.
    part = max(parts, key=lambda p: len(want.get(p, {})))
    first = _ask(bed, "a", part, limit=1)
    assert first.truncated and len(first.batches) == 1
    assert first.batches[0] == got[part].batches[0]
    # The pages after it give the rest, each batch once.
    rest = _ask(bed, "a", part, limit=1, after=first.batches[0].position)
    assert rest.batches[0] == got[part].batches[1]
    with _admin(bed, "a") as admin:
        assert fetch_every_batch(admin, part, "s", page=1).batches == got[part].batches
    consumer.close()
    # The broker holds what the plugin says: only the rest of each batch comes again.
    _unacked(got, sizes, _redelivered(bed, name))


@pytest.mark.slow  # a test bed of its own: CURSORSYNC_SLOW=1 runs it
def test_after_an_unload_the_plugin_still_says_what_the_broker_holds(
        plugin_bed: TestBed) -> None:
    bed = plugin_bed
    name = "unloaded"
    (part,) = bed.create_topic(name)
    consumer, want, sizes = _partly_acked(bed, name, [part], seed=4)
    assert _settled(bed, [part], want)[part].acked == want[part]
    consumer.close()
    bed.admin_call("a", "PUT", TopicName.parse(part).admin_path("unload"))
    after = _ask(bed, "a", part)  # loads the topic again on the broker
    # Pulsar 4.0.8 writes a closing cursor's batch indexes to the metadata store but does
    # not read them back (apache/pulsar#20585, #26475): the reloaded cursor holds none, and
    # the plugin says so. A broker with the fix keeps them; the check below holds either way.
    assert after.batch_index_acks and after.acked == {}
    again = _redelivered(bed, name)
    _unacked({part: after}, sizes, again)
    assert {p: len(i) for p, i in again[part].items() if p in want[part]} == {
        p: BATCH for p in want[part]}


@pytest.mark.slow  # a test bed of its own: CURSORSYNC_SLOW=1 runs it
def test_a_broker_keeping_no_batch_indexes_says_so(plugin_bed: TestBed) -> None:
    bed = plugin_bed
    topic = f"persistent://public/default/no-batch-index-{time.time_ns()}"
    client = bed.client("b")
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                batch_index_ack_enabled=True)
    _batched(client, [topic], BATCH)
    got = [consumer.receive(10_000) for _ in range(BATCH)]
    consumer.acknowledge(got[0])
    answer = _ask(bed, "b", topic)
    assert not answer.batch_index_acks and answer.batches == ()
    consumer.close()


@pytest.mark.slow  # a test bed of its own: CURSORSYNC_SLOW=1 runs it
def test_unknown_topics_and_subscriptions_are_the_plugins_404(plugin_bed: TestBed) -> None:
    bed = plugin_bed
    (part,) = bed.create_topic("known")
    with pytest.raises(BatchAcksNotFoundError, match=f"topic {bed.topic('nowhere')} not "):
        _ask(bed, "a", bed.topic("nowhere"))
    with pytest.raises(BatchAcksNotFoundError, match="subscription s not found"):
        _ask(bed, "a", part)
    # What cursorsync never asks (TopicName refuses it first), the plugin refuses too.
    answer = bed.admin_call("a", "GET", "/cursorsync/batch-acks?subscription=s&topic="
                            "non-persistent://public/default/x", ok=(400,))
    assert answer["plugin"] == "cursorsync" and "not persistent" in answer["error"]


def test_without_the_plugin_the_endpoint_is_absent(testbed: TestBed) -> None:
    """The shared test bed runs brokers as Pulsar ships them: the path is unknown there."""
    (part,) = testbed.create_topic(f"no-plugin-{time.time_ns()}")
    with _admin(testbed, "a") as admin, pytest.raises(BatchAcksPluginAbsentError,
                                                      match="answered 404"):
        fetch_batch_acks(admin, part, "s")


def test_a_plugin_not_built_is_named_with_its_build(tmp_path: Path) -> None:
    config = TestBedConfig(work_dir=tmp_path, broker_plugin=tmp_path / "missing.nar")
    with pytest.raises(TestBedError, match="build it first") as err:
        TestBed(config)
    assert BROKER_PLUGIN_BUILD in str(err.value)


def _digests(bed: TestBed, subscriptions: tuple[str, ...] = ("s",)) -> dict[str, TopicDigest]:
    with _admin(bed, "a") as admin:
        got = fetch_cursor_digests(admin, bed.namespace, subscriptions)
    assert got.namespace == bed.namespace and got.broker
    return dict(got.topics)


def _change(bed: TestBed, before: dict[str, TopicDigest], parts: list[str]
            ) -> tuple[set[str], dict[str, TopicDigest]]:
    """The topics of ``parts`` that moved since ``before`` once something did (acks reach
    the broker a little after acknowledge() returns), read again half a second later."""
    deadline = time.monotonic() + 15
    while True:
        now = _digests(bed)
        if moved(before, now) & set(parts) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    time.sleep(0.5)
    now = _digests(bed)
    return moved(before, now) & set(parts), now


def _cursor(bed: TestBed, part: str) -> tuple[str, str]:
    c = bed.internal_stats("a", part)["cursors"]["s"]
    return c["markDeletePosition"], c["individuallyDeletedMessages"]


def _same_as_internal_stats(bed: TestBed, digests: dict[str, TopicDigest],
                            parts: list[str]) -> None:
    """The acks digest of each partition's s is the one cursorsync computes from what
    internalStats show of it."""
    for part in parts:
        md, ranges = _cursor(bed, part)
        assert digests[part].cursors["s"].acks == acks_digest(
            Position.parse(md), parse_range_bounds(ranges)), (part, md, ranges)


@pytest.mark.slow  # a test bed of its own: CURSORSYNC_SLOW=1 runs it
def test_the_cursor_digests_change_with_each_kind_of_ack_and_nothing_else(
        plugin_bed: TestBed) -> None:
    bed = plugin_bed
    name = "digests"
    parts = bed.create_topic(name, partitions=3)
    client = bed.client("a")
    consumer = client.subscribe(bed.topic(name), "s", consumer_type=pulsar.ConsumerType.Shared,
                                batch_index_ack_enabled=True)
    other = client.subscribe(bed.topic(name), "other", consumer_type=pulsar.ConsumerType.Shared)
    got: dict[str, list[Any]] = {p: [] for p in parts}
    for part in parts:
        single = client.create_producer(part, batching_enabled=False)
        for i in range(4):
            single.send(f"single-{i}".encode())
        single.close()
        _batched(client, [part], BATCH, prefix="batched-")
    for _ in range(len(parts) * (4 + BATCH)):
        m = consumer.receive(10_000)
        got[m.topic_name()].append(m)
    for _ in range(len(parts) * (4 + BATCH)):
        other.acknowledge(other.receive(10_000))

    # Nothing acked on s: the answer holds still, and names s only.
    before = _digests(bed)
    time.sleep(1.0)
    assert _digests(bed) == before
    assert set(parts) <= set(before)
    assert all(set(before[p].cursors) == {"s"} for p in parts)
    assert all(set(d.cursors) == {"s", "other"} for p, d in _digests(bed, ()).items()
               if p in parts)
    _same_as_internal_stats(bed, before, parts)

    # A hole: the second message of partition 0 acked alone.
    p0, p1, p2 = parts
    consumer.acknowledge(got[p0][1])
    changed, now = _change(bed, before, parts)
    assert changed == {p0} and now[p0].ledgers == before[p0].ledgers
    _same_as_internal_stats(bed, now, parts)  # with a hole in the ranges
    # A batch-index ack on partition 1: the cursor's markDeletePosition and ranges in
    # internalStats do not move, the digest does.
    stats_before, before = _cursor(bed, p1), now
    batched = [m for m in got[p1] if m.message_id().batch_index() >= 0
               and m.data().startswith(b"batched")]
    consumer.acknowledge(batched[2])
    changed, now = _change(bed, before, parts)
    assert changed == {p1}
    assert _cursor(bed, p1) == stats_before
    assert now[p1].cursors["s"].acks == before[p1].cursors["s"].acks
    # The markDeletePosition moves on partition 2.
    before = now
    consumer.acknowledge(got[p2][0])
    changed, now = _change(bed, before, parts)
    assert changed == {p2} and now[p2].ledgers == before[p2].ledgers
    _same_as_internal_stats(bed, now, parts)
    # An entry added to partition 2: its ledgers line moves, its cursor does not.
    before = now
    producer = client.create_producer(p2, batching_enabled=False)
    producer.send(b"late")
    producer.close()
    changed, now = _change(bed, before, parts)
    assert changed == {p2}
    assert now[p2].ledgers != before[p2].ledgers and now[p2].cursors == before[p2].cursors
    consumer.close()
    other.close()


@pytest.mark.slow  # a test bed of its own: CURSORSYNC_SLOW=1 runs it
def test_the_cursor_digests_of_a_namespace_nobody_serves_here_are_none(
        plugin_bed: TestBed) -> None:
    bed = plugin_bed
    with _admin(bed, "a") as admin:
        assert fetch_cursor_digests(admin, "public/unserved").topics == {}
    answer = bed.admin_call("a", "GET", "/cursorsync/cursors?namespace=not-a-namespace",
                            ok=(400,))
    assert answer["plugin"] == "cursorsync" and "not a valid namespace" in answer["error"]


@pytest.mark.slow  # a benchmark, on a test bed of its own
def test_bench_admin_measures_the_plugins_digests_beside_the_source_polls(
        plugin_bed: TestBed, tmp_path: Path) -> None:
    """With the plugin loaded, the benchmark asks for the namespace's digests too: it lists
    every partition of its topic, and with nothing changed says none moved; the plugin's
    stats list every partition's, and the target reads take every cursor from one plugin
    request a round (the benchmark raises if one is read without it)."""
    from cursorsync_devtools.bench_admin import bench_admin

    r = bench_admin(20, workers=(1,), repeat=2, bed=plugin_bed, work_dir=str(tmp_path))
    digests = r["source_poll"]["plugin_digests"]
    assert digests["partitions_listed"] == 20 and digests["partitions_moved"] == 0
    assert digests["topics_listed"] >= 20
    assert digests["seconds"] > 0 and digests["requests"] == 1
    stats = r["source_poll"]["plugin_stats"]
    assert stats["partitions_with_stats"] == 20 and stats["topics_listed"] >= 20
    targets = r["plugin_target_reads"]
    assert targets["plugin_requests_per_round"] == 1 and targets["seconds"] > 0


@pytest.mark.slow  # a test bed of its own: CURSORSYNC_SLOW=1 runs it
def test_a_poll_with_digests_reads_only_the_partitions_that_moved(
        plugin_bed: TestBed, tmp_path: Path) -> None:
    """``pulsar-cursors`` with ``cursorDigests`` on real brokers: a poll with nothing changed
    reads no partition and keeps the rows it read; an ack (a hole, then a batch-index ack
    that leaves internalStats as they were) has its partition read again, the others not;
    the rows are those a poll without the digests reads."""
    from cursorsync.sync.cursors import CursorsOptions, PulsarCursorsStreamReader

    bed = plugin_bed
    name = "polled-by-digests"
    parts = bed.create_topic(name, partitions=3)
    client = bed.client("a")
    consumer = client.subscribe(bed.topic(name), "s", consumer_type=pulsar.ConsumerType.Shared,
                                batch_index_ack_enabled=True)
    _batched(client, parts, 2 * BATCH)
    got: dict[str, list[Any]] = {p: [] for p in parts}
    for _ in range(len(parts) * 2 * BATCH):
        m = consumer.receive(10_000)
        got[m.topic_name()].append(m)

    def reader(state: str, **extra: str) -> PulsarCursorsStreamReader:
        return PulsarCursorsStreamReader(CursorsOptions.parse({
            "adminUrl": bed.admin_url("a"), "cluster": "a", "topics": bed.topic(name),
            "subscriptions": "s", "stateDir": str(tmp_path / state), **extra}))

    def poll(r: PulsarCursorsStreamReader) -> dict[int, tuple[Any, ...]]:
        return {row[2]: row for row in r.poll()}

    polls = reader("digests", internalStatsMaxAgeMs="600000", cursorDigests="true")
    first = poll(polls)
    assert polls.partitions_read == 3
    second = poll(polls)
    assert (polls.partitions_read, polls.partitions_unchanged) == (0, 3)
    assert {p: r[:9] for p, r in second.items()} == {p: r[:9] for p, r in first.items()}
    # A whole batch acked on partition 1, leaving the first unacked: a hole.
    _, p1, p2 = parts
    before = _cursor(bed, p1)
    for m in got[p1][BATCH:]:
        consumer.acknowledge(m)
    deadline = time.monotonic() + 15
    while _cursor(bed, p1) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    third = poll(polls)
    assert (polls.partitions_read, polls.partitions_unchanged) == (1, 2)
    assert third[1][5] != first[1][5]
    # One message of partition 2's first batch: internalStats stay as they were, the
    # batches digest moves, the partition is read again.
    before = _digests(bed)
    consumer.acknowledge(got[p2][1])
    changed, _ = _change(bed, before, parts)
    assert changed == {p2}
    poll(polls)
    assert (polls.partitions_read, polls.partitions_unchanged) == (1, 2)
    consumer.close()
    # The same rows as a poll that reads every partition.
    plain = reader("plain", internalStatsMaxAgeMs="0")
    assert {p: r[:7] for p, r in poll(plain).items()} == {
        p: r[:7] for p, r in poll(polls).items()}
