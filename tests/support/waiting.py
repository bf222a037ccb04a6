"""Waiting for a real broker to show something, with a bound."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    """``check()``'s first truthy answer; AssertionError naming ``what`` after the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)
