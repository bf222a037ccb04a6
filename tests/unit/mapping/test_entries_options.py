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


def test_ledger_lists_come_from_one_admin_client_for_the_readers_life(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A trigger after ledgers rolled everywhere asks for every partition's ledger list:
    one client (a TLS context and a connection pool) serves them all, closed with the
    reader."""
    from cursorsync.core.ledgers import Ledgers
    from cursorsync.mapping import entries

    made: list[FakeAdmin] = []

    class FakeAdmin:
        def __init__(self, settings: object) -> None:
            self.asked: list[str] = []
            self.closed = False
            made.append(self)

        def internal_stats(self, topic: str) -> object:
            self.asked.append(str(topic))
            ledger = int(str(topic).rsplit("-", 1)[1]) + 1
            return type("Stats", (), {"ledgers": Ledgers.of([(ledger, 10), (ledger + 100, 5)])})

        def map_concurrently(self, fn, topics):  # type: ignore[no-untyped-def]
            return {str(entries.TopicName.parse(t)): fn(t) for t in topics}

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(entries, "AdminClient", FakeAdmin)
    base = {"serviceUrl": "pulsar://127.0.0.1:1", "adminUrl": "http://127.0.0.1:1",
            "cluster": "a", "topics": "t"}
    r = PulsarEntriesStreamReader(EntriesOptions.parse(base))
    topics = [f"persistent://p/n/t-partition-{i}" for i in range(5)]
    for _ in range(3):
        begin = {t: Position(i + 1, 9) for i, t in enumerate(topics)}
        latest = {t: Position(i + 101, 4) for i, t in enumerate(topics)}
        available, first = r._available(begin, latest)
        assert available == dict.fromkeys(topics, 5)
        assert first == {t: Position(i + 101, 0) for i, t in enumerate(topics)}
    assert len(made) == 1 and len(made[0].asked) == 15
    r.stop()
    assert made[0].closed


def test_with_plugin_positions_ledger_lists_come_from_the_plugin_and_the_rest_one_by_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``pluginPositions``: the ledger lists of a trigger's ranges across ledgers are asked
    of the brokers' plugin for the mapping subscription's partitions at once; a partition
    it does not list is read with an internalStats request of its own."""
    from cursorsync.core.ledgers import Ledgers
    from cursorsync.mapping import entries

    def ledgers_of(topic: str) -> Ledgers:
        ledger = int(str(topic).rsplit("-", 1)[1]) + 1
        return Ledgers.of([(ledger, 10), (ledger + 100, 5)])

    asked: list[str] = []
    plugin_asked: list[dict[str, tuple[str, ...]]] = []

    class FakeAdmin:
        def __init__(self, settings: object) -> None:
            pass

        def internal_stats(self, topic: str) -> object:
            asked.append(str(topic))
            return type("Stats", (), {"ledgers": ledgers_of(topic)})

        def map_concurrently(self, fn, topics):  # type: ignore[no-untyped-def]
            return {str(entries.TopicName.parse(t)): fn(t) for t in topics}

        def close(self) -> None:
            pass

    class FakePlugin:
        def __init__(self, admin: object, what: str) -> None:
            assert what == "the ledger lists"

        def read(self, wanted: dict[str, tuple[str, ...]]) -> dict[str, object]:
            plugin_asked.append(dict(wanted))
            return {t: type("Stats", (), {"ledgers": ledgers_of(t)})
                    for t in wanted if not t.endswith("-4")}  # one it does not list

    monkeypatch.setattr(entries, "AdminClient", FakeAdmin)
    monkeypatch.setattr(entries, "PluginCursorStats", FakePlugin)
    base = {"serviceUrl": "pulsar://127.0.0.1:1", "adminUrl": "http://127.0.0.1:1",
            "cluster": "a", "topics": "t", "pluginPositions": "true"}
    r = PulsarEntriesStreamReader(EntriesOptions.parse(base))
    topics = [f"persistent://p/n/t-partition-{i}" for i in range(5)]
    begin = {t: Position(i + 1, 9) for i, t in enumerate(topics)}
    latest = {t: Position(i + 101, 4) for i, t in enumerate(topics)}
    available, first = r._available(begin, latest)
    assert available == dict.fromkeys(topics, 5)
    assert first == {t: Position(i + 101, 0) for i, t in enumerate(topics)}
    assert plugin_asked == [dict.fromkeys(topics, ("cursorsync-mapping",))]
    assert asked == [topics[4]]
    # The ranges are sized from those lists, as from internalStats.
    assert [p.entries for p in r.ranges(begin, latest)] == [5] * 5
    r.stop()
