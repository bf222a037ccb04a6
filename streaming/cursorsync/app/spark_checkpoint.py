"""What a Spark streaming query's checkpoint says, read as files (no Spark needed).

Spark lays a query's checkpoint out as ``metadata`` (one JSON line with the query's
``id``, written when the query first starts), ``offsets/N`` (logged before batch N
runs) and ``commits/N`` (written once batch N's sink returned). A batch whose offsets
are logged but not committed runs again, with the same id, at the next start. Spark
keeps the last files only (``minBatchesToRetain``), so the highest N is what counts.

Paths are local (relative to the working directory), ``file://`` or an object-store
URI pyarrow reads (``s3://``, Hadoop's ``s3a://`` taken as ``s3://``, ``gs://``,
``abfs://``), with the credentials pyarrow finds in the environment.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass

import pyarrow.fs as pafs

from cursorsync.errors import CursorSyncError


class CheckpointReadError(CursorSyncError):
    """A checkpoint's files cannot be listed, read or written; names the path."""


@dataclass(frozen=True, slots=True)
class QueryCheckpoint:
    """The state of one query's checkpoint directory."""

    location: str
    #: The Spark query id from ``metadata`` (None before the query first started).
    query_id: str | None
    #: The highest N of ``offsets/N`` (None: no batch was ever planned).
    last_offset: int | None
    #: The highest N of ``commits/N`` (None: no batch ever completed).
    last_commit: int | None

    @property
    def fresh(self) -> bool:
        """No batch in it: absent, empty, or a query stopped before its first batch."""
        return self.last_offset is None and self.last_commit is None


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """The file system holding ``location`` and the path on it."""
    if "://" not in location:
        return pafs.LocalFileSystem(), os.path.abspath(location)
    uri = "s3://" + location[len("s3a://"):] if location.startswith("s3a://") else location
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise CheckpointReadError(f"cannot reach checkpoint {location}: {err}") from err
    return fs, path.rstrip("/")


def read_checkpoint(location: str) -> QueryCheckpoint:
    """What the checkpoint at ``location`` holds (all None when there is none)."""
    fs, root = filesystem(location)
    try:
        text = read_text(fs, f"{root}/metadata")
        offsets = _last_batch(fs, f"{root}/offsets")
        commits = _last_batch(fs, f"{root}/commits")
    except OSError as err:
        raise CheckpointReadError(f"cannot read checkpoint {location}: {err}") from err
    query_id = None
    if text is not None and text.strip():
        try:
            query_id = str(json.loads(text.splitlines()[0])["id"])
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointReadError(
                f"checkpoint {location}: metadata is not Spark's ({err})") from err
    return QueryCheckpoint(location, query_id, offsets, commits)


def _last_batch(fs: pafs.FileSystem, directory: str) -> int | None:
    """The highest batch file in ``directory``; Spark's ``.N.crc`` and ``.N.<uuid>.tmp``
    files beside them are not batches."""
    infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    numbers = [int(i.base_name) for i in infos
               if i.type == pafs.FileType.File and i.base_name.isdigit()]
    return max(numbers) if numbers else None


def read_text(fs: pafs.FileSystem, path: str) -> str | None:
    """A small file's text; None when it does not exist."""
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        return bytes(f.read()).decode()


def write_text(fs: pafs.FileSystem, path: str, text: str) -> None:
    """``text`` to ``path``, whole or not at all: a local file is written beside it and
    renamed; an object store's put is atomic by itself."""
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    local = isinstance(fs, pafs.LocalFileSystem)
    part = f"{path}.{uuid.uuid4().hex}.part" if local else path
    with fs.open_output_stream(part) as f:
        f.write(text.encode())
    if local:
        fs.move(part, path)
