"""Mapping batches on request: work the builder left for later (skipped target ids waiting
for their check) needs a batch, and Spark runs one only when a source's offset moves.

The mapping sink writes a request number into a file under the job's checkpoint (the
number of the batch to come, so requests only grow); the target's ``pulsar-entries``
source, given that file (option ``wakeFile``), carries the largest number it has seen as
its offset's ``tick``, and a larger one moves the offset: the batch that follows may have
no rows. A file, because Spark runs a Python data source's driver side in a process of its
own, not in the job's.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from cursorsync.files import replace_text


def request(path: str | Path, number: int) -> None:
    """Ask the source watching ``path`` for a batch: ``number`` must exceed earlier ones."""
    replace_text(Path(path), str(int(number)))  # the source never reads half a number


def requested(path: str | Path) -> int:
    """The last request number written to ``path``; 0 when there is none."""
    with contextlib.suppress(OSError, ValueError):
        return int(Path(path).read_text().strip() or 0)
    return 0
