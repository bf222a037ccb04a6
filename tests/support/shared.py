"""Resources several test modules share, a test bed or a JVM that takes half a minute to
start: the modules using one run one after another, and it stops after the last test that
uses it, not at the end of the run (an idle bed would slow every test after it).

A test uses a shared resource when its fixture closure names the resource's fixture, or
when it carries the ``shares`` marker naming it (a fixture asked for with
``request.getfixturevalue`` on one parameter only, as the delta-spark cases do).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

T = TypeVar("T")
#: A test, as the run knows it (pytest's item: its node id may change after collection).
Test = Hashable


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


def last_users(order: Sequence[tuple[Test, set[str]]]) -> dict[str, Test]:
    """Shared resource -> the last test in ``order`` (test, resources used) that uses it."""
    last: dict[str, Test] = {}
    for test, uses in order:
        for name in uses:
            last[name] = test
    return last


class SharedResources:
    """Open resources by fixture name, each closed once its last user is done."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[Any, contextlib.ExitStack]] = {}
        self._closed_after: dict[str, Test] = {}

    def plan(self, order: Sequence[tuple[Test, set[str]]]) -> None:
        """Record the run's order (test, resources it uses)."""
        self._closed_after = last_users(order)

    def get(self, name: str, open_it: Callable[[], AbstractContextManager[T]]) -> T:
        """The resource, opened by entering ``open_it()`` the first time it is asked for."""
        if name not in self._open:
            stack = contextlib.ExitStack()
            try:
                self._open[name] = (stack.enter_context(open_it()), stack)
            except BaseException:
                stack.close()
                raise
        value: T = self._open[name][0]
        return value

    def done(self, test: Test) -> None:
        """A test is done: close what it was the last user of."""
        for name, last in self._closed_after.items():
            if last == test:
                self.close(name)

    def close(self, name: str) -> None:
        opened = self._open.pop(name, None)
        if opened is not None:
            opened[1].close()

    def close_all(self) -> None:
        for name in list(self._open):
            self.close(name)


#: The run's shared resources (the conftest's fixtures and hooks use it).
RESOURCES = SharedResources()
