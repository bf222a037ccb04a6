"""The pulsar-entries source's options: each error names its option."""

from __future__ import annotations

import pytest

from cursorsync.core.positions import Position
from cursorsync.errors import ConfigError
from cursorsync.mapping.entries import PulsarEntriesStreamReader
from cursorsync.mapping.entries_options import EntriesOptions
from cursorsync.mapping.entries_tasks import entries_positions


def test_options_errors_name_the_option() -> None:
    base = {"serviceUrl": "pulsar://127.0.0.1:1", "adminUrl": "http://127.0.0.1:1",
            "cluster": "a", "topics": "t"}
    with pytest.raises(ConfigError, match="cluster"):
        EntriesOptions.parse({k: v for k, v in base.items() if k != "cluster"})
    with pytest.raises(ConfigError, match="serviceUrl"):
        EntriesOptions.parse({**base, "serviceUrl": "http://x"})
    # The admin API sizes ranges across ledgers and answers the tail check: required.
    with pytest.raises(ConfigError, match="adminUrl"):
        EntriesOptions.parse({k: v for k, v in base.items() if k != "adminUrl"})
    with pytest.raises(ConfigError, match="adminUrl"):
        EntriesOptions.parse({**base, "adminUrl": "pulsar://x:1"})
    with pytest.raises(ConfigError, match="maxRowsPerBatch"):
        EntriesOptions.parse({**base, "maxRowsPerBatch": "0"})
    with pytest.raises(ConfigError, match="startingPosition"):
        EntriesOptions.parse({**base, "startingPosition": "middle"})
    with pytest.raises(ConfigError, match="identityFields"):
        EntriesOptions.parse({**base, "identityFields": "payload,colour"})
    with pytest.raises(ConfigError, match="tailCheckMs"):
        EntriesOptions.parse({**base, "tailCheckMs": "0"})
    o = EntriesOptions.parse({**base, "MAXROWSPERBATCH": "5", "identityFields": "payload"})
    assert o.max_rows_per_batch == 5 and o.identity_fields == ("payload",)
    assert o.subscription == "cursorsync-mapping" and o.tail_check_ms == 1000
    assert o.admin is not None and o.admin.urls == ("http://127.0.0.1:1",)
    # The tail check's settings reach every range's reader.
    r = PulsarEntriesStreamReader(EntriesOptions.parse({**base, "tailCheckMs": "500"}))
    lo, hi = {"t": Position(1, 0)}, {"t": Position(1, 9)}
    assert [(p.tail_check_ms, p.admin) for p in r.ranges(lo, hi)] == [(500, o.admin)]
    with pytest.raises(ConfigError, match="version"):
        entries_positions({"version": 2, "positions": {}})
