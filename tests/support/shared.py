"""Resources several test modules share, a test bed or a JVM that takes half a minute to
start: the modules using one run one after another, and it stays open from the first test
of those modules to the last, closing as soon as the next test's module does not use it
(an idle bed would slow every test after it).

A module uses a shared resource when one of its tests' fixture closure names the
resource's fixture, or carries the ``shares`` marker naming it (a fixture asked for with
``request.getfixturevalue`` on one parameter only, as the delta-spark cases do).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

T = TypeVar("T")


def names_used(fixturenames: Iterable[str], marked: Iterable[str],
               shared: Sequence[str]) -> set[str]:
    """The shared resources one test uses: by its fixture closure or its ``shares`` marks."""
    return {name for name in (*fixturenames, *marked) if name in shared}


def grouped(modules: Sequence[tuple[str, set[str]]], shared: Sequence[str]) -> list[str]:
    """Module ids in run order: each module that uses a shared resource right after the
    earlier modules using the same one (the first it uses, in ``shared``'s order); the
    others keep their places."""
    blocks: list[list[str]] = []
    group_of: dict[str, list[str]] = {}
    for module, uses in modules:
        key = next((name for name in shared if name in uses), None)
        if key is None:
            blocks.append([module])
        elif key in group_of:
            group_of[key].append(module)
        else:
            group_of[key] = [module]
            blocks.append(group_of[key])
    return [m for block in blocks for m in block]


class SharedResources:
    """Open resources by fixture name."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[Any, contextlib.ExitStack]] = {}

    def get(self, name: str, open_it: Callable[[], AbstractContextManager[T]]) -> T:
        """The resource, opened by entering ``open_it()`` if it is not open."""
        if name not in self._open:
            stack = contextlib.ExitStack()
            self._open[name] = (stack.enter_context(open_it()), stack)
        value: T = self._open[name][0]
        return value

    def keep_only(self, names: set[str]) -> None:
        """Close every open resource but ``names`` (those the next test's module uses)."""
        for name in [n for n in self._open if n not in names]:
            self._open.pop(name)[1].close()


#: The run's shared resources (the conftest's fixtures and hooks use it).
RESOURCES = SharedResources()
