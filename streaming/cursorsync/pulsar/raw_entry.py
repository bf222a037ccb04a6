"""What one stored entry is, from the headers of the admin API's raw-entry endpoint
(``GET .../ledger/{l}/entry/{e}``, PersistentTopicsBase in Pulsar): marker, chunk, batch
size, where a copy came from, its properties."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from cursorsync.errors import AdminError, MalformedAdminOutputError
from cursorsync.pulsar.markers import (
    REPLICATED_SUBSCRIPTION_TYPES,
    Marker,
    MarkerParseError,
    parse_marker,
)


@dataclass(frozen=True)
class RawEntry:
    """The headers of ``GET .../ledger/{l}/entry/{e}`` that say what an entry is, and a
    marker's body (the protobuf its type names; None for other entries, and for a marker
    body too large to read)."""

    marker_type: int | None = None
    chunk_id: int | None = None
    num_chunks: int | None = None
    body: bytes | None = None
    #: Messages in the entry: a batch's size (``X-Pulsar-num-batch-message``), else 1.
    messages: int = 1
    #: The cluster the entry was replicated from (``X-Pulsar-replicated-from``; None: written
    #: here by a producer or the broker).
    replicated_from: str | None = None
    #: The message's properties (``X-Pulsar-PROPERTY``, a JSON object; empty for a batch,
    #: whose properties are its messages').
    properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_marker(self) -> bool:
        """Written by the broker for itself: never dispatched, so safe to ack."""
        return self.marker_type is not None

    def marker(self, where: str) -> Marker | None:
        """The marker parsed (None: not a marker, or a type not read, such as a transaction
        marker); MarkerParseError naming ``where`` when its body is not what its type says."""
        if self.marker_type is None:
            return None
        if self.body is None and self.marker_type in REPLICATED_SUBSCRIPTION_TYPES:
            raise MarkerParseError(where, self.marker_type, "its body was not read (larger "
                                   f"than {_DRAIN_BYTES} bytes, or of unknown length)")
        return parse_marker(self.marker_type, self.body or b"", where=where)


def _header_int(what: str, resp: httpx.Response, name: str) -> int | None:
    value = resp.headers.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise AdminError(f"{what}: header {name} is {value!r}, not an integer") from None


#: A raw entry's body up to this size is read (and dropped) to keep the connection.
_DRAIN_BYTES = 64 * 1024


def raw_entry_of(what: str, resp: httpx.Response) -> RawEntry:
    """The entry ``GET .../ledger/{l}/entry/{e}`` answered with (``what`` names it)."""
    # The headers say what the entry is. A small body (a marker's) is read, so the
    # connection (and its TLS session) is reused, and kept when it is a marker's; a large
    # one (a chunk, up to the broker's max message size) is left unread, which closes that
    # connection.
    marker_type = _header_int(what, resp, "X-Pulsar-marker-type")
    size = resp.headers.get("Content-Length")
    body = None
    if size is not None and size.isdigit() and int(size) <= _DRAIN_BYTES:
        content = resp.read()
        body = content if marker_type is not None else None
    return RawEntry(marker_type,
                    _header_int(what, resp, "X-Pulsar-chunk-id"),
                    _header_int(what, resp, "X-Pulsar-num-chunks-from-msg"),
                    body, _header_int(what, resp, "X-Pulsar-num-batch-message") or 1,
                    resp.headers.get("X-Pulsar-replicated-from"),
                    _header_properties(what, resp))


def _header_properties(what: str, resp: httpx.Response) -> dict[str, str]:
    value = resp.headers.get("X-Pulsar-PROPERTY")
    if value is None:
        return {}
    try:
        props = json.loads(value)
    except ValueError:
        props = None
    if not isinstance(props, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in props.items()):
        raise MalformedAdminOutputError(
            f"{what}: header X-Pulsar-PROPERTY is not a JSON object of strings ({value!r})")
    return props


#: What the broker's 500 for an id past the last entry of the open ledger, and of a closed
#: one, says.
_PAST_END_TEXTS = ("LastConfirmedEntry", "No such entry")


def past_end(resp: httpx.Response) -> bool:
    """The broker's answer for an id past a ledger's last entry."""
    return resp.status_code == 500 and any(t in resp.text for t in _PAST_END_TEXTS)


__all__ = ["RawEntry", "past_end", "raw_entry_of"]
