from cursorsync_devtools.bench import bench_mapping_rows


def test_mapping_rows_bench_maps_every_entry_and_counts_rows() -> None:
    r = bench_mapping_rows(5_000, batch_entries=500)
    assert r["mapped"] == 5_000
    assert r["rows_joined_tail_carried"] == 1  # one ledger each side, nothing unmapped
    assert r["rows_written"] >= r["rows_joined_per_batch"] >= r["rows_joined_tail_carried"]
    # Each batch appends a row to the table; the maintenance merge leaves one.
    assert r["segment_rows_in_table"] == r["rows_written"] == 10
    assert r["segment_rows_after_merge"] == 1
