"""``cursorsync-dev bench mapping-batch``, small: every active partition's entries are mapped
in every batch (the benchmark checks it), the state it saves holds every partition, and
the figures are out."""

from __future__ import annotations

import json

from cursorsync_devtools.bench_mapping_batch import bench_mapping_batch


def test_a_small_mapping_batch_run_maps_every_entry_and_reports() -> None:
    out = bench_mapping_batch(400, active=0.1, entries=5, batches=2)
    json.dumps(out)  # what --json prints
    assert (out["partitions"], out["active_partitions"], out["entries_per_batch"]) == (
        400, 40, 200)
    assert len(out["batches"]) == 2
    assert all(b["process_seconds"] > 0 and b["state_seconds"] > 0 for b in out["batches"])
    # The rows the sink writes: each active partition's new segment (one a batch).
    assert all(b["rows_seconds"] > 0 and b["rows"] == 40 for b in out["batches"])
    # A row per partition, idle ones included: tens of bytes each, not nothing.
    assert 400 * 20 < out["state_file_bytes"] < 400 * 1000
    assert out["state_load_seconds"] > 0 and out["state_bytes_per_partition"] > 0
