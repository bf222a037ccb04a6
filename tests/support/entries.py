"""Helpers of the sources' tests: topics and messages on the test bed, entries readers,
rows as dicts, a scripted reader for read_entries, the admin stub serving cursors."""

from __future__ import annotations

from typing import Any

import pulsar
import pyarrow as pa

from cursorsync.mapping.entries import PulsarEntriesStreamReader
from cursorsync.mapping.entries_options import EntriesOptions
from cursorsync.pulsar.topics import TopicName
from cursorsync_devtools.testbed import TestBed
from tests.support.admin_stub import BASE, Reply, StubAdmin, stats_doc

#: Each cluster's own namespace: a topic there is not replicated.
LOCAL_NS = "persistent://public/default"
REPL = "__MSG_PROP_REPL_SOURCE_POSITION"


# -- helpers ---------------------------------------------------------------------------

_clients: dict[str, Any] = {}


def client_of(bed: TestBed, cluster: str) -> Any:
    """One pulsar client per cluster for this module's producers and probes."""
    url = bed.service_url(cluster)
    if url not in _clients:
        _clients[url] = bed.client(cluster)  # closed by the test bed
    return _clients[url]


def local_topic(bed: TestBed, cluster: str, name: str, partitions: int = 0) -> list[str]:
    """A topic on ``cluster`` only (its public/default namespace); its partitions, or itself.

    It has a subscription from its start: a broker deletes the rolled ledgers of a topic
    nobody subscribes to, as the mapping subscription keeps them in production.
    """
    t = TopicName.parse(f"{LOCAL_NS}/{name}")
    if partitions:
        bed.admin_call(cluster, "PUT", t.admin_path("partitions"), json=partitions)
    else:
        bed.admin_call(cluster, "PUT", t.admin_path())
    client_of(bed, cluster).subscribe(
        str(t), "keep", initial_position=pulsar.InitialPosition.Earliest).close()
    return [str(t.with_partition(i)) for i in range(partitions)] if partitions else [str(t)]


def produce(client: Any, topic: str, *, unbatched: int, batches: list[int],
            tag: str = "") -> None:
    """``unbatched`` single-message entries, then one batched entry per size in ``batches``."""
    p = client.create_producer(topic, batching_enabled=False, producer_name=f"single{tag}")
    for i in range(unbatched):
        props = {"i": str(i)}
        if i == 0:
            props[REPL] = "77:5"
        p.send(f"u{i}".encode(), properties=props, partition_key=f"k{i}",
               event_timestamp=1000 + i)
    p.close()
    pb = client.create_producer(topic, batching_enabled=True, batching_max_messages=100,
                                batching_max_publish_delay_ms=60_000, producer_name=f"batch{tag}")
    for size in batches:
        for j in range(size):
            pb.send_async(f"b{size}-{j}".encode(), None, properties={"j": str(j)})
        pb.flush()
    pb.close()


def entries_reader(bed: TestBed, topics: list[str], cluster: str = "a",
                   **extra: str) -> PulsarEntriesStreamReader:
    opts = {"serviceUrl": bed.service_url(cluster), "adminUrl": bed.admin_url(cluster),
            "cluster": cluster, "topics": ",".join(topics), **extra}
    return PulsarEntriesStreamReader(EntriesOptions.parse(opts))


def read_all(r: PulsarEntriesStreamReader, start: dict, end: dict) -> list[tuple]:
    """Rows as tuples in column order, from the Arrow record batches read() hands Spark."""
    rows: list[tuple] = []
    for p in r.partitions(start, end):
        for batch in r.read(p):
            assert isinstance(batch, pa.RecordBatch)
            for row in batch.to_pylist():
                if row.get("properties") is not None:
                    row["properties"] = dict(row["properties"])
                rows.append(tuple(row.values()))
    return rows


def read_range_by_range(r: PulsarEntriesStreamReader) -> list[list[dict[str, Any]]]:
    """The rows of each batch the reader's admission control makes, from the start on."""
    offset = r.initialOffset()
    batches = []
    while (nxt := r.latestOffset(offset, r.getDefaultReadLimit())) != offset:
        batches.append(as_dicts(read_all(r, offset, nxt)))
        offset = nxt
    return batches


COLS = ("cluster", "topic", "partition", "ledger", "entry", "batch_index", "batch_size",
        "producer_name", "publish_time", "event_time", "properties", "partition_key",
        "ordering_key", "source_position", "identity", "entry_identity", "payload_size",
        "first_chunk")


def as_dicts(rows: list[tuple]) -> list[dict[str, Any]]:
    return [dict(zip(COLS, r, strict=True)) for r in rows]


# -- read_entries against a scripted reader: re-deliveries, columns, the tail check ------


class _Id:
    """A received message id; a batched one serialises with its batch size (field 6)."""

    def __init__(self, ledger: int, entry: int, index: int = -1, size: int = 0) -> None:
        self.l, self.e, self.i, self.n = ledger, entry, index, size

    def ledger_id(self) -> int:
        return self.l

    def entry_id(self) -> int:
        return self.e

    def batch_index(self) -> int:
        return self.i

    def serialize(self) -> bytes:
        return bytes([0x08, *_varint(self.l), 0x10, *_varint(self.e), 0x30, *_varint(self.n)])


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


class _Msg:
    def __init__(self, mid: _Id, props: dict[str, str] | None = None) -> None:
        self.mid, self.props = mid, props or {}

    def message_id(self) -> _Id:
        return self.mid

    def properties(self) -> dict[str, str]:
        return self.props

    def partition_key(self) -> str:
        return ""

    def ordering_key(self) -> str:
        return ""

    def data(self) -> bytes:
        return f"{self.mid.e}/{self.mid.i}".encode()

    def event_timestamp(self) -> int:
        return 0

    def producer_name(self) -> str:
        return "p"

    def publish_timestamp(self) -> int:
        return 1


class _ScriptedClient:
    """connect() -> itself; its reader returns ``script`` (None: a poll that times out)
    then times out; ``timeouts`` counts the polls that timed out."""

    def __init__(self, script: list[_Msg | None]) -> None:
        self.script = list(script)
        self.timeouts = 0

    def connect(self) -> _ScriptedClient:
        return self

    def create_reader(self, *_a: Any, **_k: Any) -> _ScriptedClient:
        return self

    def read_next(self, _timeout: int) -> _Msg:
        msg = self.script.pop(0) if self.script else None
        if msg is None:
            self.timeouts += 1
            raise pulsar.Timeout()
        return msg

    def has_message_available(self) -> bool:
        return any(self.script)

    def close(self) -> None:
        pass


def serve_partitioned(admin: StubAdmin, md: str) -> None:
    admin.set(BASE + "/partitions", Reply(body={"partitions": 2}))
    admin.set(BASE + "/partitioned-internalStats", Reply(body={
        "metadata": {"partitions": 2},
        "partitions": {f"persistent://acme/orders/events-partition-{i}": stats_doc(
            "3:9", [(1, 5), (3, 0)], {"svc": (md, "[(3:2..3:5], (3:6..3:7]]"),
                                      "other": ("1:0", "[]"),
                                      "pulsar.repl.b": ("3:9", "[]")}, counter=40 + i)
            for i in range(2)}}))


def send_batches(client: Any, topic: str, count: int, batch: int, prefix: str = "m") -> None:
    """``count`` messages (payloads ``{prefix}{i:03d}``) to ``topic`` in batches of ``batch``
    on one producer, flushed and closed."""
    producer = client.create_producer(topic, batching_enabled=True,
                                      batching_max_messages=batch,
                                      batching_max_publish_delay_ms=1000)
    for i in range(count):
        producer.send_async(f"{prefix}{i:03d}".encode(), None)
    producer.flush()
    producer.close()
