"""Whether the source's cursor polls succeed: kept beside the stored polls for ``status``.

The poll runs in the ``pulsar-cursors`` source's reader, a Python process of Spark's own
on the driver's machine; a poll that fails gives the sync no batch at all, so nothing
reaches the tables. This small file is how ``cursorsync status`` learns that the rows it
shows are old because the source cannot be read, and why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from cursorsync.files import replace_text

#: The stored polls' directory under the job's ``spark.checkpoint_dir``.
POLLS_DIR = "cursor-polls"
#: The file's name in that directory.
FILE = "poll-health.json"


@dataclass(frozen=True)
class PollHealth:
    """The source polls as the reader last saw them."""

    #: The last poll that succeeded.
    ok_at: datetime | None = None
    #: The first of the polls failing since the last success (None: the last one succeeded).
    failing_since: datetime | None = None
    #: Polls failed in a row.
    failures: int = 0
    #: The last failure's message.
    error: str | None = None

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def succeeded(self, at: datetime) -> PollHealth:
        return PollHealth(ok_at=at)

    def failed(self, at: datetime, error: str) -> PollHealth:
        return replace(self, failing_since=self.failing_since or at,
                       failures=self.failures + 1, error=error)

    def to_dict(self) -> dict[str, Any]:
        return {"ok_at": _iso(self.ok_at), "failing_since": _iso(self.failing_since),
                "failures": self.failures, "error": self.error}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> PollHealth:
        return cls(ok_at=_time(doc.get("ok_at")), failing_since=_time(doc.get("failing_since")),
                   failures=int(doc.get("failures") or 0), error=doc.get("error"))


def write(directory: Path, health: PollHealth) -> None:
    """Replace the file at once (a reader never sees half of it); no fsync: it informs, and
    the next poll writes it again."""
    replace_text(directory / FILE, json.dumps(health.to_dict()))


def read(directory: Path) -> PollHealth | None:
    """The health the reader last wrote under ``directory``; None when there is none to
    read (another machine than the driver's, or no poll yet)."""
    try:
        return PollHealth.from_dict(json.loads((directory / FILE).read_text()))
    except (OSError, ValueError):
        return None


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def _time(text: Any) -> datetime | None:
    return None if not text else datetime.fromisoformat(str(text))


__all__ = ["FILE", "POLLS_DIR", "PollHealth", "read", "write"]
