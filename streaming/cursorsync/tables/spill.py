"""Arrays and tables the driver keeps off its heap: written to a file and mapped back.

A job of 100,000 partitions keeps a row per partition between batches (its packed mapping,
its idle cursor), and most partitions sit still. Kept on the heap, those rows make the
driver's memory grow with every partition; mapped from a file, they are page cache, which
the kernel writes back and drops under pressure instead of the driver being killed, and
the heap grows with the moving partitions only.

Each file is unlinked as soon as it is mapped: the kernel frees it with its last mapping,
so a crash leaves nothing behind. Nothing in it is needed across a restart (the job
rebuilds the rows from its tables and the next poll).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np
import pyarrow as pa

from cursorsync.errors import CursorSyncError


class SpillError(CursorSyncError):
    """A spill file cannot be written or mapped; names its directory."""


class Spill:
    """Keeps arrays and tables in memory-mapped files under ``directory`` (the system's
    temporary directory, ``TMPDIR``, by default)."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = str(directory or tempfile.gettempdir())

    def array(self, values: np.ndarray, *, writable: bool = False) -> np.ndarray:
        """An array equal to ``values``, mapped from a file (read-only unless
        ``writable``: then writes change the mapping, not ``values``)."""
        if not values.size:
            return values.copy()
        with self._file(values.nbytes) as path:
            with open(path, "wb") as out:
                np.ascontiguousarray(values).tofile(out)
            mapped = np.memmap(path, dtype=values.dtype, mode="r+" if writable else "r",
                               shape=values.shape)
        # A plain array viewing the mapping: numpy's results of a memmap are memmaps too.
        return mapped.view(np.ndarray)

    def table(self, table: pa.Table) -> pa.Table:
        """A table equal to ``table``, one chunk per column, its buffers mapped from a file."""
        table = table.combine_chunks()
        if not table.num_rows:
            return table
        with self._file(table.nbytes) as path:
            with pa.OSFile(path, "wb") as out, pa.ipc.new_file(out, table.schema) as writer:
                writer.write_table(table)
            return pa.ipc.open_file(pa.memory_map(path)).read_all()

    @contextmanager
    def _file(self, size: int) -> Iterator[str]:
        """A new file's path, unlinked when the block ends; SpillError on any OS error."""
        path = None
        try:
            fd, path = tempfile.mkstemp(prefix="cursorsync-", suffix=".spill",
                                        dir=self.directory)
            os.close(fd)
            yield path
        except OSError as err:
            raise SpillError(f"cannot keep {size} bytes in a file in {self.directory} "
                             f"(set TMPDIR to a writable local directory with room): "
                             f"{err}") from err
        finally:
            if path is not None:
                with suppress(OSError):
                    os.unlink(path)
