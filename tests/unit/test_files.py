"""Files replaced whole (cursorsync.files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cursorsync.files import replace_file, replace_text


def test_a_file_is_replaced_whole_and_a_failed_write_leaves_the_old_one(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    replace_text(target, "one")
    replace_text(target, "two", durable=True)
    assert target.read_text() == "two"

    def torn(tmp: Path) -> None:
        tmp.write_text("thr")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replace_file(target, torn)
    assert target.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary left
