"""A one-line elapsed-time ticker on stderr while a long command runs."""

from __future__ import annotations

import os
import sys
import threading
import time
from types import TracebackType


class Progress:
    """A one-line elapsed-time ticker on stderr while something long runs.

    Shown only when stderr is a terminal and the output is not JSON; the line
    is erased when the work ends, so nothing is left in logs or pipes.
    """

    def __init__(self, label: str, *, enabled: bool, interval_s: float = 0.25) -> None:
        self._label = label
        self._enabled = enabled
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0
        self._width = 0

    def update(self, label: str) -> None:
        """Change what the line says is happening."""
        self._label = label

    def _tick(self) -> None:
        while not self._stop.wait(self._interval):
            self._write(f"{self._label} ... {time.monotonic() - self._start:.1f}s")

    def _write(self, text: str) -> None:
        pad = max(0, self._width - len(text))
        self._width = len(text)
        try:
            sys.stderr.write("\r" + text + " " * pad)
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed under us: stop ticking, nothing to show
            self._stop.set()

    def __enter__(self) -> Progress:
        if self._enabled:
            self._start = time.monotonic()
            self._thread = threading.Thread(target=self._tick, name="cli-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        if self._width:
            self._write("")
            sys.stderr.write("\r")
            sys.stderr.flush()


def progress(label: str, *, json_output: bool) -> Progress:
    """A ticker shown only on a terminal, never with JSON output or under CI."""
    enabled = not json_output and sys.stderr.isatty() and not os.environ.get("CI")
    return Progress(label, enabled=enabled)
