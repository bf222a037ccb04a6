"""Files replaced whole: a reader sees the old content or the new, never part of it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def replace_file(path: Path, write: Callable[[Path], None], *, durable: bool = False) -> None:
    """Write ``path`` anew: ``write`` fills a temporary file beside it, which then takes its
    place in one rename. ``durable``: synced to disk before the rename, for what a restart
    must find (a crash otherwise may leave the renamed file empty)."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def replace_text(path: Path, text: str, *, durable: bool = False) -> None:
    """:func:`replace_file` with ``text`` (UTF-8)."""
    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")

    replace_file(path, write, durable=durable)


__all__ = ["replace_file", "replace_text"]
