"""How a source poll asks for a partitioned topic's cursors: in one request up to a width,
partition by partition beyond it (a wide topic's one answer overran the admin timeout)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cursorsync.sync.cursors import (
    WHOLE_READ_MAX_PARTITIONS,
    CursorsOptions,
    PulsarCursorsStreamReader,
)
from tests.support.admin_stub import BASE, Reply, StubAdmin, stats_doc

TOPIC = "persistent://acme/orders/events"


def serve(admin: StubAdmin, partitions: int) -> None:
    admin.set(BASE + "/partitions", Reply(body={"partitions": partitions}))
    docs = {i: stats_doc("3:9", [(3, 0)], {"svc": ("3:4", "[]")}, counter=i)
            for i in range(partitions)}
    admin.set(BASE + "/partitioned-internalStats", Reply(body={
        "metadata": {"partitions": partitions},
        "partitions": {f"{TOPIC}-partition-{i}": d for i, d in docs.items()}}))
    for i, d in docs.items():
        admin.set(f"{BASE}-partition-{i}/internalStats", Reply(body=d))


def poll(admin: StubAdmin, tmp_path: Path) -> list[tuple[str, int]]:
    reader = PulsarCursorsStreamReader(CursorsOptions.parse({
        "adminUrl": admin.url, "cluster": "a", "topics": TOPIC, "subscriptions": "svc",
        "stateDir": str(tmp_path), "adminAttempts": "1", "internalStatsMaxAgeMs": "0"}))
    rows, _ = reader.read(reader.initialOffset())
    return [(r[2], r[8]) for r in rows]


@pytest.mark.parametrize("partitions", [2, WHOLE_READ_MAX_PARTITIONS])
def test_a_topic_up_to_the_width_is_read_in_one_request(admin: StubAdmin, tmp_path: Path,
                                                        partitions: int) -> None:
    serve(admin, partitions)
    assert sorted(poll(admin, tmp_path)) == [(i, i) for i in range(partitions)]
    paths = [p for p, _ in admin.requests if "nternalStats" in p]
    assert paths == [BASE + "/partitioned-internalStats"]


def test_a_wider_topic_is_read_partition_by_partition(admin: StubAdmin, tmp_path: Path) -> None:
    partitions = WHOLE_READ_MAX_PARTITIONS + 1
    serve(admin, partitions)
    assert sorted(poll(admin, tmp_path)) == [(i, i) for i in range(partitions)]
    paths = sorted(p for p, _ in admin.requests if "nternalStats" in p)
    assert paths == sorted(f"{BASE}-partition-{i}/internalStats" for i in range(partitions))
