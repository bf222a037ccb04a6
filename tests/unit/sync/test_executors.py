"""The task function of emission spread across executors, as Spark ships it."""

from __future__ import annotations

from pyspark import cloudpickle

from cursorsync.sync import executors


def shipped(batch_id: int):  # type: ignore[no-untyped-def]
    """The task function of a batch, pickled and loaded as a Python worker does."""
    fn = executors.sync_partitions(None, batch_id, dry_run=True, cumulative=False)  # type: ignore[arg-type]
    return cloudpickle.loads(cloudpickle.dumps(fn))


def test_tasks_of_every_batch_share_the_workers_marker_cache() -> None:
    """Markers found by one batch's task are known to the next batch's in the same worker:
    the cache is reached through a function pickled by reference, not a copied global."""
    first, second = shipped(1), shipped(2)
    url = "http://source.invalid:8080"
    cache = first.__globals__["worker_marker_cache"](url)
    assert second.__globals__["worker_marker_cache"](url) is cache
    assert executors.worker_marker_cache(url) is cache


def test_the_task_function_carries_no_copy_of_module_state() -> None:
    """cloudpickle ships a closure with a copy of each module global it names: a dict, list
    or set among them would be a new, empty one in every task."""
    captured = {name: value for name, value in shipped(1).__globals__.items()
                if isinstance(value, dict | list | set) and not name.startswith("__")}
    assert captured == {}
