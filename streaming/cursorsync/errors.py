"""One exception hierarchy, rooted at CursorSyncError, so callers can catch ours only."""

from __future__ import annotations


def show_name(name: str) -> str:
    """A name read from input as an error message shows it: quoted when it would not show
    as itself on one line (empty, blank at either end, control characters)."""
    return name if name and name.isprintable() and name.strip() == name else repr(name)


class CursorSyncError(Exception):
    """Base of every error cursorsync raises on purpose."""


class PositionFormatError(CursorSyncError, ValueError):
    """A position or range string is not in Pulsar's format; names the text and the offset."""

    def __init__(self, text: str, offset: int, expected: str) -> None:
        snippet = text if len(text) <= 60 else text[max(0, offset - 20) : offset + 20]
        super().__init__(
            f"malformed position text at offset {offset}: expected {expected}, "
            f"found {text[offset:offset + 12]!r} (context: {snippet!r})"
        )
        self.text = text
        self.offset = offset
        self.expected = expected


class MappingConflictError(CursorSyncError, ValueError):
    """Segments claim one target entry for two sources; names the conflicting segments."""


class ConfigError(CursorSyncError, ValueError):
    """The configuration is invalid; the message names every offending key."""


class AdminError(CursorSyncError):
    """The Pulsar admin API could not be used: unreachable, refused, or returned malformed data."""


class AdminUnavailableError(AdminError):
    """The admin API gave no usable answer: unreachable, timing out or failing (5xx) after
    every retry, or answering what cannot be parsed. The job treats it as passing: a poll
    is skipped, a subscription waits for the next batch, a failed query is restarted."""


class MalformedAdminOutputError(AdminUnavailableError):
    """An admin answer that is not what Pulsar's admin API returns; names the field."""


class TopicNotFoundError(AdminError):
    """A configured topic does not exist (any more) on the named cluster."""



class EndpointError(CursorSyncError, OSError):
    """An endpoint cursorsync serves cannot be opened (its port taken, or not one the
    process may bind); names the host and port. An OSError too, for callers that catch
    those."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


class RunIncompleteError(CursorSyncError):
    """``cursorsync run --once`` ended before its queries completed the batches it waits
    for."""
