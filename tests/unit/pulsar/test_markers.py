"""Replicated-subscription markers: parsing and fuzzing (their meaning on real Pulsar:
tests/integration/pulsar/test_markers.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cursorsync._proto import pulsar_markers_pb2 as pm
from cursorsync.core.positions import INT64_MAX, Position
from cursorsync.errors import CursorSyncError
from cursorsync.pulsar.markers import (
    SNAPSHOT,
    SNAPSHOT_REQUEST,
    SNAPSHOT_RESPONSE,
    UPDATE,
    ClusterPositions,
    Marker,
    MarkerParseError,
    Snapshot,
    SnapshotRequest,
    SnapshotResponse,
    SubscriptionUpdate,
    parse_marker,
)
from cursorsync.pulsar.raw_entry import RawEntry

WHERE = "entry 12:5 of persistent://t/n/x on cluster a"
TYPES = (SNAPSHOT_REQUEST, SNAPSHOT_RESPONSE, SNAPSHOT, UPDATE)


def mid(ledger: int, entry: int) -> pm.MarkersMessageIdData:
    return pm.MarkersMessageIdData(ledger_id=ledger, entry_id=entry)


def cmid(cluster: str, ledger: int, entry: int) -> pm.ClusterMessageId:
    return pm.ClusterMessageId(cluster=cluster, message_id=mid(ledger, entry))


def parse(marker_type: int, body: bytes) -> Marker | None:
    return parse_marker(marker_type, body, where=WHERE)


def marker_or_error(marker_type: int, body: bytes) -> Marker | MarkerParseError:
    """The parse's outcome; any exception other than MarkerParseError fails the test."""
    try:
        got = parse(marker_type, body)
    except MarkerParseError as e:
        assert WHERE in str(e) and e.marker_type == marker_type
        return e
    assert isinstance(got, SnapshotRequest | SnapshotResponse | Snapshot | SubscriptionUpdate)
    return got


# --------------------------------------------------------------------------- round trips


def test_a_snapshot_request_round_trips() -> None:
    body = pm.ReplicatedSubscriptionsSnapshotRequest(snapshot_id="s-1", source_cluster="a")
    assert parse(SNAPSHOT_REQUEST, body.SerializeToString()) == SnapshotRequest("s-1", "a")
    bare = pm.ReplicatedSubscriptionsSnapshotRequest(snapshot_id="s-2")
    assert parse(SNAPSHOT_REQUEST, bare.SerializeToString()) == SnapshotRequest("s-2", None)


def test_a_snapshot_response_round_trips() -> None:
    body = pm.ReplicatedSubscriptionsSnapshotResponse(snapshot_id="s-1",
                                                      cluster=cmid("b", 40, 7))
    assert parse(SNAPSHOT_RESPONSE, body.SerializeToString()) == SnapshotResponse(
        "s-1", "b", Position(40, 7))


def test_a_snapshot_round_trips_and_its_clusters_are_a_frozen_mapping() -> None:
    body = pm.ReplicatedSubscriptionsSnapshot(
        snapshot_id="s-1", local_message_id=mid(12, 9),
        clusters=[cmid("c", 3, 1), cmid("b", INT64_MAX, 0), cmid("c", 3, 1)])
    got = parse(SNAPSHOT, body.SerializeToString())
    want = Snapshot("s-1", Position(12, 9),
                    ClusterPositions({"b": Position(INT64_MAX, 0), "c": Position(3, 1)}))
    assert got == want and hash(got) == hash(want)
    assert isinstance(got, Snapshot)
    assert got.clusters["b"] == Position(INT64_MAX, 0) and list(got.clusters) == ["b", "c"]
    assert dict(got.clusters) == {"b": Position(INT64_MAX, 0), "c": Position(3, 1)}
    assert got.clusters == {"c": Position(3, 1), "b": Position(INT64_MAX, 0)}


def test_a_subscription_update_round_trips() -> None:
    body = pm.ReplicatedSubscriptionsUpdate(subscription_name="rs", clusters=[cmid("b", 5, 0)])
    assert parse(UPDATE, body.SerializeToString()) == SubscriptionUpdate(
        "rs", ClusterPositions([("b", Position(5, 0))]))


@pytest.mark.parametrize("marker_type", [20, 21, 22, 0, 1, 14, 99, -1])
def test_types_not_read_give_none_whatever_the_body(marker_type: int) -> None:
    assert parse(marker_type, b"") is None
    assert parse(marker_type, b"\xff\xff\xff") is None


def test_cluster_positions_refuse_two_positions_for_one_cluster() -> None:
    with pytest.raises(ValueError, match=r"cluster 'b' has two positions: 1:1 and 1:2"):
        ClusterPositions([("b", Position(1, 1)), ("b", Position(1, 2))])
    assert ClusterPositions([("b", Position(1, 1))] * 2) == ClusterPositions(
        {"b": Position(1, 1)})
    assert len({ClusterPositions({"b": Position(1, 1)}), ClusterPositions(
        [("b", Position(1, 1))])}) == 1


# --------------------------------------------------------------------------- malformed bodies


def error_of(marker_type: int, body: bytes) -> str:
    with pytest.raises(MarkerParseError) as info:
        parse(marker_type, body)
    assert isinstance(info.value, CursorSyncError)
    text = str(info.value)
    assert text.startswith(WHERE + ": "), text
    return text


def test_a_truncated_body_names_the_entry_and_the_type() -> None:
    good = pm.ReplicatedSubscriptionsSnapshot(snapshot_id="s-1", local_message_id=mid(1, 2),
                                              clusters=[cmid("b", 3, 4)]).SerializeToString()
    text = error_of(SNAPSHOT, good[:-3])
    assert "REPLICATED_SUBSCRIPTION_SNAPSHOT marker (type 12)" in text
    assert "is not a valid ReplicatedSubscriptionsSnapshot" in text


def test_bytes_that_are_not_protobuf_are_an_error() -> None:
    assert "is not a valid ReplicatedSubscriptionsUpdate" in error_of(UPDATE, b"\x0c\xff")


def test_a_missing_required_field_is_named() -> None:
    assert "required field(s) missing: snapshot_id" in error_of(SNAPSHOT_REQUEST, b"")
    partial = pm.ReplicatedSubscriptionsSnapshot(snapshot_id="s", local_message_id=mid(1, 1))
    partial.clusters.add(cluster="b")
    text = error_of(SNAPSHOT, partial.SerializePartialToString())
    assert "required field(s) missing: clusters[0].message_id" in text


def test_a_snapshot_without_local_message_id_is_an_error() -> None:
    body = pm.ReplicatedSubscriptionsSnapshot(snapshot_id="s", clusters=[cmid("b", 1, 1)])
    assert "local_message_id is missing" in error_of(SNAPSHOT, body.SerializeToString())


def test_a_response_without_its_cluster_is_an_error() -> None:
    body = pm.ReplicatedSubscriptionsSnapshotResponse(snapshot_id="s")
    assert "cluster is missing" in error_of(SNAPSHOT_RESPONSE, body.SerializeToString())


def test_positions_past_int64_are_an_error() -> None:
    body = pm.ReplicatedSubscriptionsSnapshot(snapshot_id="s", local_message_id=mid(2**63, 0))
    text = error_of(SNAPSHOT, body.SerializeToString())
    assert f"local_message_id {2**63}:0 is not a position" in text
    body = pm.ReplicatedSubscriptionsUpdate(subscription_name="rs",
                                            clusters=[cmid("b", 1, 2**64 - 1)])
    assert "clusters[0].message_id" in error_of(UPDATE, body.SerializeToString())


def test_one_cluster_with_two_positions_is_an_error() -> None:
    body = pm.ReplicatedSubscriptionsUpdate(subscription_name="rs",
                                            clusters=[cmid("b", 1, 2), cmid("b", 1, 3)])
    assert "clusters: cluster 'b' has two positions" in error_of(UPDATE, body.SerializeToString())


def test_text_that_is_not_utf8_is_an_error() -> None:
    body = b"\x0a\x02\xff\xfe"  # field 1 (snapshot_id), two bytes that are not UTF-8
    assert "snapshot_id is not UTF-8 text" in error_of(SNAPSHOT_REQUEST, body)


def test_a_raw_entry_parses_its_own_marker() -> None:
    body = pm.ReplicatedSubscriptionsSnapshotRequest(snapshot_id="s").SerializeToString()
    assert RawEntry(SNAPSHOT_REQUEST, body=body).marker(WHERE) == SnapshotRequest("s", None)
    assert RawEntry().marker(WHERE) is None
    assert RawEntry(21, body=b"").marker(WHERE) is None
    with pytest.raises(MarkerParseError, match="its body was not read"):
        RawEntry(SNAPSHOT).marker(WHERE)


# --------------------------------------------------------------------------- fuzz

FUZZ = settings(max_examples=150, deadline=None)

ids = st.integers(0, INT64_MAX)
any_ids = st.integers(0, 2**64 - 1)  # what a uint64 field can hold
names = st.text(max_size=12)


def positions(values: st.SearchStrategy[int] = ids) -> st.SearchStrategy[pm.MarkersMessageIdData]:
    return st.builds(mid, values, values)


def cluster_ids(values: st.SearchStrategy[int] = ids
                ) -> st.SearchStrategy[list[pm.ClusterMessageId]]:
    return st.lists(st.builds(pm.ClusterMessageId, cluster=st.sampled_from(["a", "b", "c"]),
                              message_id=positions(values)), max_size=4)


def bodies(values: st.SearchStrategy[int] = ids) -> st.SearchStrategy[tuple[int, Any]]:
    """Complete messages of every type, as (marker type, message)."""
    return st.one_of(
        st.tuples(st.just(SNAPSHOT_REQUEST), st.builds(
            pm.ReplicatedSubscriptionsSnapshotRequest, snapshot_id=names,
            source_cluster=st.none() | names)),
        st.tuples(st.just(SNAPSHOT_RESPONSE), st.builds(
            pm.ReplicatedSubscriptionsSnapshotResponse, snapshot_id=names,
            cluster=st.none() | st.builds(cmid, names, values, values))),
        st.tuples(st.just(SNAPSHOT), st.builds(
            pm.ReplicatedSubscriptionsSnapshot, snapshot_id=names,
            local_message_id=st.none() | positions(values), clusters=cluster_ids(values))),
        st.tuples(st.just(UPDATE), st.builds(
            pm.ReplicatedSubscriptionsUpdate, subscription_name=names,
            clusters=cluster_ids(values))),
    )


def expected(marker_type: int, msg: Any) -> Marker | None:
    """The oracle: what a complete message with in-range ids means, or None for an error."""
    def pos(m: pm.MarkersMessageIdData) -> Position:
        return Position(m.ledger_id, m.entry_id)

    def clusters(items: Any) -> ClusterPositions | None:
        try:
            return ClusterPositions([(c.cluster, pos(c.message_id)) for c in items])
        except ValueError:
            return None

    if marker_type == SNAPSHOT_REQUEST:
        source = msg.source_cluster if msg.HasField("source_cluster") else None
        return SnapshotRequest(msg.snapshot_id, source)
    if marker_type == SNAPSHOT_RESPONSE:
        if not msg.HasField("cluster"):
            return None
        return SnapshotResponse(msg.snapshot_id, msg.cluster.cluster, pos(msg.cluster.message_id))
    found = clusters(msg.clusters)
    if found is None:
        return None
    if marker_type == SNAPSHOT:
        if not msg.HasField("local_message_id"):
            return None
        return Snapshot(msg.snapshot_id, pos(msg.local_message_id), found)
    return SubscriptionUpdate(msg.subscription_name, found)


@FUZZ
@given(bodies())
def test_complete_messages_parse_to_what_they_say(typed: tuple[int, Any]) -> None:
    marker_type, msg = typed
    want = expected(marker_type, msg)
    got = marker_or_error(marker_type, msg.SerializeToString())
    if want is None:
        assert isinstance(got, MarkerParseError)
    else:
        assert got == want


@FUZZ
@given(bodies(any_ids))
def test_every_prefix_of_a_body_is_a_marker_or_a_parse_error(typed: tuple[int, Any]) -> None:
    marker_type, msg = typed
    body = msg.SerializeToString()
    for n in range(len(body)):
        marker_or_error(marker_type, body[:n])


@FUZZ
@given(st.sampled_from(TYPES), st.binary(max_size=64))
def test_random_bytes_are_a_marker_or_a_parse_error(marker_type: int, body: bytes) -> None:
    marker_or_error(marker_type, body)


@FUZZ
@given(bodies(any_ids), st.sampled_from(TYPES))
def test_a_body_read_as_another_type_is_a_marker_or_a_parse_error(
        typed: tuple[int, Any], as_type: int) -> None:
    marker_or_error(as_type, typed[1].SerializeToString())


@FUZZ
@given(bodies(any_ids), st.data())
def test_a_body_with_a_flipped_byte_is_a_marker_or_a_parse_error(
        typed: tuple[int, Any], data: st.DataObject) -> None:
    marker_type, msg = typed
    body = bytearray(msg.SerializeToString())
    if body:
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] ^= data.draw(st.integers(1, 255))
    marker_or_error(marker_type, bytes(body))
