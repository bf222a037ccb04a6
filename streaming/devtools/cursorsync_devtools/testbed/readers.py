"""Plain pulsar-client Readers over whole topic partitions: where keyed messages landed
on a cluster, and how fast Readers alone get through entries (a benchmark's baseline).
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cursorsync.core.positions import Position
from cursorsync_devtools.testbed.testbed import TestBed, TestBedError

#: How long a Reader may wait for its next message before the read is given up.
READ_TIMEOUT_MS = 20_000
#: How often a stalled read is opened again after its last message.
READER_REOPENS = 2


def positions_by_key(bed: TestBed, cluster: str, messages: Mapping[str, int]
                     ) -> dict[str, Position]:
    """``properties["key"]`` -> entry position on ``cluster``, for every keyed message of the
    topic partitions; ``messages``: how many keyed messages each holds (read until then).

    A reader that stops short while the partition holds entries past its last message is
    opened again after that message, up to :data:`READER_REOPENS` times (a broker just
    restarted now and then leaves a reader's dispatch stalled)."""
    import pulsar

    client = bed.client(cluster)
    out: dict[str, Position] = {}
    for topic, expected in messages.items():
        got, last, reopens = 0, pulsar.MessageId.earliest, 0
        reader = client.create_reader(topic, last)
        try:
            while got < expected:
                try:
                    msg = reader.read_next(READ_TIMEOUT_MS)
                except pulsar.Timeout:
                    stored = bed.last_entry(cluster, topic)
                    at = (None if last is pulsar.MessageId.earliest
                          else Position(last.ledger_id(), last.entry_id()))
                    if reopens < READER_REOPENS and (at is None or at < stored):
                        reopens += 1
                        reader.close()
                        reader = client.create_reader(topic, last)
                        continue
                    raise TestBedError(f"cluster {cluster}: {topic} gave {got} of {expected} "
                                       f"keyed messages (the last at {at}; the partition "
                                       f"ends at {stored}), then nothing for "
                                       f"{READ_TIMEOUT_MS / 1000:.0f} s, {reopens + 1} "
                                       f"time(s)") from None
                last = msg.message_id()
                key = msg.properties().get("key")
                if key is not None:
                    out[key] = Position(last.ledger_id(), last.entry_id())
                    got += 1
        finally:
            reader.close()
    return out


@dataclass(frozen=True)
class ReaderRate:
    """Readers alone over a set of topic partitions: how long they took, side by side."""

    seconds: float
    readers: int
    processes: int
    messages: int


def reader_rate(reads: Sequence[tuple[str, str, int]], *, processes: int,
                receiver_queue_size: int) -> ReaderRate:
    """Read each (service URL, topic partition, messages) from the earliest message with a
    plain Reader, ``processes`` at a time in processes of their own (as a Spark job's tasks
    do on as many cores); the time from the first read's start to the last one's end.

    The processes are started and warm (pulsar imported) before the clock starts, and a
    reader only counts messages: this is what the client and the brokers can deliver.
    Workers are ``python -m cursorsync_devtools.testbed.readers``, not multiprocessing, which would
    run the caller's main script again in each of them.
    """
    workers = [subprocess.Popen([sys.executable, "-m", "cursorsync_devtools.testbed.readers"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for _ in range(max(1, processes))]
    todo: queue.SimpleQueue[tuple[int, tuple[str, str, int]]] = queue.SimpleQueue()
    for i, read in enumerate(reads):
        todo.put((i, read))
    counts = [0] * len(reads)

    def serve(worker: subprocess.Popen[str]) -> None:
        assert worker.stdin is not None and worker.stdout is not None
        while True:
            try:
                i, (url, topic, n) = todo.get_nowait()
            except queue.Empty:
                return
            worker.stdin.write(json.dumps([url, topic, n, receiver_queue_size]) + "\n")
            worker.stdin.flush()
            counts[i] = int(worker.stdout.readline() or -1)

    try:
        for w in workers:
            assert w.stdout is not None
            if w.stdout.readline().strip() != "ready":
                raise TestBedError("a reader process did not start (see its error above)")
        t0 = time.monotonic()
        threads = [threading.Thread(target=serve, args=(w,)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.monotonic() - t0
    finally:
        for w in workers:
            assert w.stdin is not None
            w.stdin.close()
            w.wait(30)
    for (_, topic, expected), got in zip(reads, counts, strict=True):
        if got != expected:
            raise TestBedError(f"reader over {topic} got {got} of {expected} messages")
    return ReaderRate(seconds, len(reads), len(workers), sum(counts))


def _read_count(service_url: str, topic: str, expected: int, receiver_queue_size: int) -> int:
    """Messages a Reader delivers from the earliest, up to ``expected`` (fewer: it went
    silent for READ_TIMEOUT_MS)."""
    import pulsar

    from cursorsync.pulsar.client import connect

    client: Any = connect(service_url, operation_timeout_seconds=30)
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest,
                                      receiver_queue_size=receiver_queue_size)
        got = 0
        while got < expected:
            try:
                reader.read_next(READ_TIMEOUT_MS)
            except pulsar.Timeout:
                break
            got += 1
        reader.close()
        return got
    finally:
        client.close()


def _worker() -> None:
    """One reader process: a JSON read per stdin line, its message count per stdout line."""
    import pulsar  # noqa: F401  (imported before the clock starts)

    print("ready", flush=True)
    for line in sys.stdin:
        print(_read_count(*json.loads(line)), flush=True)


if __name__ == "__main__":
    _worker()
