"""What the fuzz tests share: their hypothesis settings, and walking a parsed document
(internalStats JSON, a config file) by path to mutate it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from cursorsync.app.settings.messages import format_loc

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def paths(doc: Any, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Every key path inside a JSON document."""
    items = (doc.items() if isinstance(doc, dict)
             else enumerate(doc) if isinstance(doc, list) else ())
    for k, v in items:
        yield (*prefix, k)
        yield from paths(v, (*prefix, k))


def set_path(doc: Any, path: tuple[str | int, ...], value: Any, delete: bool = False) -> None:
    node = doc
    for part in path[:-1]:
        node = node[part]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value


def _get(doc: Any, path: tuple[str | int, ...]) -> Any:
    """The value at a key path."""
    for part in path:
        doc = doc[part]
    return doc


def render(path: tuple[str | int, ...]) -> str:
    return format_loc(path)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=12)
