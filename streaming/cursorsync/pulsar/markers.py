"""Replicated-subscription markers (PIP-33), read from the bodies the raw-entry endpoint returns.

Brokers write these entries into a topic for themselves; readers never receive them. With a
replicated subscription on the source a, the brokers write (types of ``marker_type``):

- 10 SNAPSHOT_REQUEST on a, replicated to every remote b;
- 11 SNAPSHOT_RESPONSE on b, carrying b's last position when it read the request, replicated
  back to a;
- 12 SNAPSHOT on a only, once every remote answered: ``local`` is the position on a of the
  response it received, paired with each remote's position from that response;
- 13 UPDATE on a, replicated: a subscription's markDeletePosition moved; each remote moves its
  subscription to the position named for it.

Parsing is strict, because an anchor guessed from a broken marker could ack what b never
delivered: a body that is not the type's proto2 message, lacks a required field, names a
position outside ``0..2**63-1``, holds text that is not UTF-8, or gives one cluster two
positions raises :class:`MarkerParseError` naming the entry. Types this module does not read
(transaction markers 20-22, unknown numbers) give None.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias, TypeVar

from google.protobuf.message import DecodeError, Message

from cursorsync._proto import pulsar_markers_pb2 as pm
from cursorsync.core.positions import INT64_MAX, Position
from cursorsync.errors import CursorSyncError

M = TypeVar("M", bound=Message)

#: ``MessageMetadata.marker_type`` of the replicated-subscription markers.
SNAPSHOT_REQUEST: Final = 10
SNAPSHOT_RESPONSE: Final = 11
SNAPSHOT: Final = 12
UPDATE: Final = 13
#: The marker types :func:`parse_marker` reads.
REPLICATED_SUBSCRIPTION_TYPES: Final = frozenset(
    {SNAPSHOT_REQUEST, SNAPSHOT_RESPONSE, SNAPSHOT, UPDATE})


class MarkerParseError(CursorSyncError, ValueError):
    """A marker body that is not what its type says; names the entry, the type and the fault."""

    def __init__(self, where: str, marker_type: int, reason: str) -> None:
        super().__init__(f"{where}: {marker_type_name(marker_type)} marker (type {marker_type}) "
                         f"cannot be read: {reason}")
        self.where = where
        self.marker_type = marker_type
        self.reason = reason


def marker_type_name(marker_type: int) -> str:
    """Pulsar's name of a marker type (``REPLICATED_SUBSCRIPTION_SNAPSHOT``), for messages."""
    try:
        return str(pm.MarkerType.Name(marker_type))
    except ValueError:
        return f"unknown marker type {marker_type}"


class ClusterPositions(Mapping[str, Position]):
    """Cluster name -> a position in that cluster's copy of the topic.

    Immutable and hashable, so markers are frozen values that fit in sets; iterates in cluster
    name order, so equal contents give equal values whatever order the broker wrote. A cluster
    given twice with the same position counts once; with two positions it is a ValueError.
    """

    __slots__ = ("_items", "_map")

    def __init__(self, pairs: Mapping[str, Position] | Iterable[tuple[str, Position]] = ()
                 ) -> None:
        found: dict[str, Position] = {}
        for cluster, pos in (pairs.items() if isinstance(pairs, Mapping) else pairs):
            seen = found.setdefault(cluster, pos)
            if seen != pos:
                raise ValueError(f"cluster {cluster!r} has two positions: {seen} and {pos}")
        self._items: tuple[tuple[str, Position], ...] = tuple(sorted(found.items()))
        self._map: dict[str, Position] = dict(self._items)

    def __getitem__(self, cluster: str) -> Position:
        return self._map[cluster]

    def __iter__(self) -> Iterator[str]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ClusterPositions):
            return self._items == other._items
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"ClusterPositions({self._map!r})"


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """Type 10: ``source_cluster`` asks every remote for its position (None: not named)."""

    snapshot_id: str
    source_cluster: str | None


@dataclass(frozen=True, slots=True)
class SnapshotResponse:
    """Type 11: ``cluster`` answers a request with its last position when it read it."""

    snapshot_id: str
    cluster: str
    position: Position


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Type 12: ``local`` (the position of the last response on this cluster) pairs with
    each remote's position in ``clusters``: an anchor per remote."""

    snapshot_id: str
    local: Position
    clusters: ClusterPositions


@dataclass(frozen=True, slots=True)
class SubscriptionUpdate:
    """Type 13: ``subscription``'s markDeletePosition, translated for each remote cluster."""

    subscription: str
    clusters: ClusterPositions


Marker: TypeAlias = SnapshotRequest | SnapshotResponse | Snapshot | SubscriptionUpdate


def parse_marker(marker_type: int, body: bytes, *, where: str) -> Marker | None:
    """The marker an entry's body holds, or None for a type not read here.

    ``where`` names the entry in errors (``"entry 12:5 of persistent://t/n/x on cluster
    a"``). Every fault of the body is a :class:`MarkerParseError`, never another error.
    """
    read = _READERS.get(marker_type)
    if read is None:
        return None
    return read(bytes(body), _Fail(where, marker_type))


class _Fail:
    """Makes the MarkerParseError of one entry."""

    def __init__(self, where: str, marker_type: int) -> None:
        self.where = where
        self.marker_type = marker_type

    def __call__(self, reason: str) -> MarkerParseError:
        return MarkerParseError(self.where, self.marker_type, reason)


def _decode(msg: M, body: bytes, fail: _Fail) -> M:
    """``body`` parsed into ``msg``, with every required field present."""
    try:
        msg.ParseFromString(body)
    except (DecodeError, UnicodeDecodeError) as e:
        raise fail(f"the body ({_show(body)}) is not a valid {msg.DESCRIPTOR.name} "
                   f"(truncated or not protobuf): {e}") from None
    # Not in types-protobuf's stub of Message, but on every runtime's message class.
    missing: list[str] = msg.FindInitializationErrors()  # type: ignore[attr-defined]
    if missing:
        raise fail(f"required field(s) missing: {', '.join(missing)} (body {_show(body)})")
    return msg


def _show(body: bytes) -> str:
    head = bytes(body[:48]).hex()
    return f"{len(body)} bytes: {head}{'...' if len(body) > 48 else ''}"


def _text(value: object, field: str, fail: _Fail) -> str:
    # A proto2 string that is not UTF-8 comes back as bytes from the upb runtime.
    if not isinstance(value, str):
        raise fail(f"{field} is not UTF-8 text: {value!r}")
    return value


def _position(msg: pm.MarkersMessageIdData, field: str, fail: _Fail) -> Position:
    ledger, entry = int(msg.ledger_id), int(msg.entry_id)
    if not (0 <= ledger <= INT64_MAX and 0 <= entry <= INT64_MAX):
        raise fail(f"{field} {ledger}:{entry} is not a position (ids are 0..2**63-1)")
    return Position(ledger, entry)


def _clusters(items: Iterable[pm.ClusterMessageId], field: str, fail: _Fail
              ) -> ClusterPositions:
    pairs = [(_text(c.cluster, f"{field}[{i}].cluster", fail),
              _position(c.message_id, f"{field}[{i}].message_id", fail))
             for i, c in enumerate(items)]
    try:
        return ClusterPositions(pairs)
    except ValueError as e:
        raise fail(f"{field}: {e}") from None


def _request(body: bytes, fail: _Fail) -> SnapshotRequest:
    msg = _decode(pm.ReplicatedSubscriptionsSnapshotRequest(), body, fail)
    source = (_text(msg.source_cluster, "source_cluster", fail)
              if msg.HasField("source_cluster") else None)
    return SnapshotRequest(_text(msg.snapshot_id, "snapshot_id", fail), source)


def _response(body: bytes, fail: _Fail) -> SnapshotResponse:
    msg = _decode(pm.ReplicatedSubscriptionsSnapshotResponse(), body, fail)
    if not msg.HasField("cluster"):
        raise fail("cluster is missing: a response names the answering cluster")
    return SnapshotResponse(_text(msg.snapshot_id, "snapshot_id", fail),
                            _text(msg.cluster.cluster, "cluster.cluster", fail),
                            _position(msg.cluster.message_id, "cluster.message_id", fail))


def _snapshot(body: bytes, fail: _Fail) -> Snapshot:
    msg = _decode(pm.ReplicatedSubscriptionsSnapshot(), body, fail)
    if not msg.HasField("local_message_id"):
        raise fail("local_message_id is missing: a snapshot without it anchors nothing")
    return Snapshot(_text(msg.snapshot_id, "snapshot_id", fail),
                    _position(msg.local_message_id, "local_message_id", fail),
                    _clusters(msg.clusters, "clusters", fail))


def _update(body: bytes, fail: _Fail) -> SubscriptionUpdate:
    msg = _decode(pm.ReplicatedSubscriptionsUpdate(), body, fail)
    return SubscriptionUpdate(_text(msg.subscription_name, "subscription_name", fail),
                              _clusters(msg.clusters, "clusters", fail))


_READERS: Final[dict[int, Callable[[bytes, _Fail], Marker]]] = {
    SNAPSHOT_REQUEST: _request,
    SNAPSHOT_RESPONSE: _response,
    SNAPSHOT: _snapshot,
    UPDATE: _update,
}


__all__ = [
    "REPLICATED_SUBSCRIPTION_TYPES", "SNAPSHOT", "SNAPSHOT_REQUEST", "SNAPSHOT_RESPONSE",
    "UPDATE", "ClusterPositions", "Marker", "MarkerParseError", "Snapshot", "SnapshotRequest",
    "SnapshotResponse", "SubscriptionUpdate", "marker_type_name", "parse_marker",
]
