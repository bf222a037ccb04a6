"""The polls ``pulsar-cursors`` stored under their offsets: Spark's replays read the rows a
poll gave, which a new poll could not repeat."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cursorsync.errors import ConfigError, CursorSyncError
from cursorsync.files import replace_text

#: A row as the source yields it, in its schema's order.
Row = tuple[Any, ...]

OFFSET_VERSION = 1
STATE_VERSION = 1
_STATE_FILE = re.compile(r"^poll-(\d{20})\.json$")


class ReplayStateError(CursorSyncError):
    """A replayed batch's stored poll is missing or unreadable; names the file."""


def poll_offset(seq: int) -> dict[str, int]:
    """The offset of the ``seq``-th stored poll."""
    return {"version": OFFSET_VERSION, "seq": seq}


def poll_sequence(offset: Mapping[str, Any]) -> int:
    """Which stored poll an offset names (:func:`poll_offset`'s ``seq``)."""
    if offset.get("version") != OFFSET_VERSION or not isinstance(offset.get("seq"), int):
        raise ConfigError(
            f"pulsar-cursors offset {dict(offset)!r} is not a version {OFFSET_VERSION} offset; "
            f"the checkpoint was written by another cursorsync version"
        )
    seq = offset["seq"]
    assert isinstance(seq, int)
    return seq


def _datetime_micros(at: datetime) -> int:
    """A datetime as microseconds since the epoch (a naive one taken as UTC)."""
    return int((at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() * 1_000_000)


def _encode_row(row: Row) -> dict[str, Any]:
    (cluster, topic, partition, sub, md, idm, ledgers, observed_at, consumed, checked_at) = row
    return {"cluster": cluster, "topic": topic, "partition": partition, "subscription": sub,
            "mark_delete": md, "individually_deleted": idm, "ledgers": ledgers,
            "observed_at_us": _datetime_micros(observed_at), "messages_consumed_counter": consumed,
            "checked_at_us": _datetime_micros(checked_at)}


def _decode_row(d: Mapping[str, Any]) -> Row:
    at = datetime.fromtimestamp(d["observed_at_us"] / 1_000_000, tz=UTC)
    # A poll stored without it was checked when it was read.
    checked = d.get("checked_at_us")
    return (d["cluster"], d["topic"], d["partition"], d["subscription"], d["mark_delete"],
            d["individually_deleted"], [tuple(x) for x in d["ledgers"]], at,
            d["messages_consumed_counter"],
            at if checked is None else datetime.fromtimestamp(checked / 1_000_000, tz=UTC))


class PollStore:
    """Polls stored by seq under one directory, written atomically (tmp file + rename)."""

    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"option stateDir: cannot create {directory!r}: {e}") from e

    def path(self, seq: int) -> Path:
        return self.dir / f"poll-{seq:020d}.json"

    def write(self, seq: int, rows: Sequence[Row]) -> None:
        doc = {"version": STATE_VERSION, "seq": seq, "rows": [_encode_row(r) for r in rows]}
        replace_text(self.path(seq), json.dumps(doc, separators=(",", ":")), durable=True)

    def read(self, seq: int) -> list[Row]:
        p = self.path(seq)
        try:
            doc = json.loads(p.read_text())
        except FileNotFoundError as e:
            raise ReplayStateError(
                f"stored poll {p} is missing: the batch ending at seq {seq} cannot be replayed "
                f"(was stateDir changed or cleaned?)"
            ) from e
        except ValueError as e:
            raise ReplayStateError(f"stored poll {p} is not valid JSON: {e}") from e
        if doc.get("version") != STATE_VERSION or doc.get("seq") != seq:
            raise ReplayStateError(f"stored poll {p} has version/seq "
                                   f"{doc.get('version')}/{doc.get('seq')}, expected "
                                   f"{STATE_VERSION}/{seq}")
        return [_decode_row(r) for r in doc["rows"]]

    def prune(self, up_to: int) -> None:
        """Delete stored polls with seq <= up_to."""
        for p in self.dir.iterdir():
            m = _STATE_FILE.match(p.name)
            if m and int(m.group(1)) <= up_to:
                p.unlink(missing_ok=True)
