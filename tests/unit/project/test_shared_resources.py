"""The test run's shared resources (tests/support/shared.py): the modules that use one run
one after another, and it closes once the next test's module does not use it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.support.shared import SharedResources, grouped, names_used

SHARED = ("bed3", "jvm")


def test_modules_sharing_a_resource_move_next_to_its_first_user() -> None:
    modules = [("e2e/a", set()), ("e2e/b", {"bed3"}), ("int/c", set()), ("int/d", {"jvm"}),
               ("int/e", {"bed3", "jvm"}), ("unit/f", set()), ("int/g", {"jvm"})]
    assert grouped(modules, SHARED) == [
        "e2e/a", "e2e/b", "int/e", "int/c", "int/d", "int/g", "unit/f"]


def test_a_test_uses_what_its_fixtures_or_its_marks_name() -> None:
    assert names_used(["tmp_path", "bed3"], [], SHARED) == {"bed3"}
    assert names_used(["tmp_path"], ["jvm"], SHARED) == {"jvm"}
    assert names_used(["testbed"], [], SHARED) == set()


def test_a_resource_stays_open_while_the_next_module_uses_it() -> None:
    events: list[str] = []

    @contextmanager
    def resource(name: str) -> Iterator[str]:
        events.append(f"open {name}")
        yield name
        events.append(f"close {name}")

    # (resources the test uses, resources the next test's module uses)
    run = [({"bed3"}, {"bed3", "jvm"}), ({"bed3", "jvm"}, {"jvm"}), ({"jvm"}, set()),
           (set(), {"jvm"}), ({"jvm"}, set())]
    shared = SharedResources()
    for uses, next_module_uses in run:
        for name in sorted(uses):
            assert shared.get(name, lambda n=name: resource(n)) == name
        shared.keep_only(next_module_uses)
    assert events == ["open bed3", "open jvm", "close bed3", "close jvm", "open jvm",
                      "close jvm"]
    shared.keep_only(set())
    assert len(events) == 6


def test_a_resource_that_fails_to_open_is_not_kept() -> None:
    shared = SharedResources()
    attempts: list[int] = []

    @contextmanager
    def flaky() -> Iterator[str]:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("the bed did not start")
        yield "up"

    with pytest.raises(RuntimeError, match="did not start"):
        shared.get("bed3", flaky)
    assert shared.get("bed3", flaky) == "up" and len(attempts) == 2
