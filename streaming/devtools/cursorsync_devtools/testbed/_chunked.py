"""Send chunked messages to one cluster from a process that talks to no other.

``python -m cursorsync_devtools.testbed._chunked SERVICE_URL TOPIC BYTES SEED [PRODUCER]``
connects, reads a JSON list of ``{key, properties, partition_key}`` on stdin, sends
one chunked message of BYTES random bytes per item, and prints
``{"key": ..., "first_chunk": "L:E"}`` per line. See ``_Publisher.chunked`` in
cursorsync_devtools.testbed.workload for why a process.
"""

from __future__ import annotations

import json
import random
import sys

from cursorsync.pulsar.client import connect
from cursorsync.pulsar.msgid import first_chunk_of


def main(argv: list[str]) -> int:
    service_url, topic, size, seed = argv[0], argv[1], int(argv[2]), int(argv[3])
    name = argv[4] if len(argv) > 4 else f"{topic.rsplit('/', 1)[-1]}-chunked"
    rng = random.Random(seed)
    client = connect(service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, batching_enabled=False, chunking_enabled=True,
                                          producer_name=name)
        for item in json.load(sys.stdin):
            mid = producer.send(rng.randbytes(size), properties=item["properties"],
                                partition_key=item["partition_key"])
            first = first_chunk_of(mid) or (mid.ledger_id(), mid.entry_id())
            print(json.dumps({"key": item["key"], "first_chunk": f"{first[0]}:{first[1]}"}),
                  flush=True)
        producer.close()
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
