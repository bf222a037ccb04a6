"""The job's input streams' data-source options, from the configuration."""

from __future__ import annotations

import pytest

from cursorsync.app.settings import parse_config
from cursorsync.app.streams import entries_options
from cursorsync.mapping.entries_options import EntriesOptions
from tests.unit.app.test_config import with_change


@pytest.mark.parametrize("digests", [False, True])
def test_the_mapping_reads_last_positions_from_the_plugin_with_cursor_digests(
        digests: bool) -> None:
    """The plugin that spark.cursor_digests needs on both clusters' brokers also answers
    the mapping's last positions on both sides."""
    config = parse_config(with_change("spark.cursor_digests", digests))
    for side in ("source", "target"):
        assert EntriesOptions.parse(entries_options(config, side)).plugin_positions is digests
