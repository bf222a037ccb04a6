"""What a source cursor covers only because ledgers are gone, and whether that may hide
entries never acked (a topic deleted and created again): the step's second filter
(:mod:`cursorsync.sync.step`), asked through :func:`cursorsync.core.continuity.uncovered`
and, when it finds some, the source topic's creation."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from cursorsync.core.continuity import uncovered
from cursorsync.core.cursor import CursorState
from cursorsync.core.records import ObservedCursor
from cursorsync.core.segments import TopicMapping
from cursorsync.errors import CursorSyncError
from cursorsync.pulsar.admin import TopicCreation

log = logging.getLogger(__name__)

SourceCreatedAt = Callable[[str], TopicCreation]


@dataclass(frozen=True, slots=True)
class Lost:
    """Entries a cursor covers that may never have been acked, and why, for the log."""

    entries: int
    why: str = ""


NOTHING_LOST = Lost(0)


class _Unreadable:
    """The source topic's internal-info could not be read."""


_UNREADABLE = _Unreadable()


class LostEntries:
    """Asks, for a cursor's plan, what it covers that may be lost (``source_created_at``:
    the source topic's creation; None: no way to ask)."""

    def __init__(self, source_created_at: SourceCreatedAt | None) -> None:
        self.source_created_at = source_created_at

    def check(self, obs: ObservedCursor, prev: ObservedCursor | None, topic: str,
              mapping: TopicMapping, target: CursorState) -> Lost | None:
        """What the cursor covers only because ledgers are gone, unless ledger ids show them
        to be its topic's (:func:`cursorsync.core.continuity.uncovered`): entries the
        previous observation showed unacked, and target copies of entries in ledgers no
        observation listed (a cursor observed for the first time, or the mapping of older
        ledgers arriving later). None when the source cannot say now."""
        previous = None if prev is None else prev.state
        found = uncovered(previous, obs.state, mapping.segments, target)
        if not found:
            return NOTHING_LOST
        creation = self._creation(obs, topic, "it covers entries in ledgers the source no "
                                  "longer lists")
        if isinstance(creation, _Unreadable):
            return None
        if creation is not None:
            found = uncovered(previous, obs.state, mapping.segments, target,
                              creation.first_ledger)
        if found.vanished:
            return Lost(found.vanished, (
                f"{found.vanished} entries its cursor showed unacked are in ledgers the "
                "source no longer lists, and the source topic owns no ledger as old as "
                "those it was observed with (deleted and created again, or unknown)"))
        if found.copies:
            count = max(found.copies.count_entries(target.ledgers), 1)
            return Lost(count, (
                f"its markDeletePosition covers {count} target copies of source entries in "
                "ledgers older than any the source topic owns now and than any observation "
                "of it listed (of a topic deleted and created again, or trimmed before: "
                "unknown)"))
        return NOTHING_LOST

    def _creation(self, obs: ObservedCursor, topic: str, what: str
                  ) -> TopicCreation | _Unreadable | None:
        """The source topic's creation (None: no way to ask), or _UNREADABLE after logging
        why this cursor waits."""
        if self.source_created_at is None:
            return None
        try:
            return self.source_created_at(topic)
        except CursorSyncError as err:
            log.warning("skip %s/%s this batch: %s, and the source topic's internal-info "
                        "cannot be read: %s", topic, obs.subscription, what, err)
            return _UNREADABLE
