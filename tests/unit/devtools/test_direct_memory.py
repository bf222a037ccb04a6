"""The brokers' direct memory watch: the largest read per broker, a broker that does not
answer left out, an answer without the figure named."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from cursorsync_devtools.testbed.direct_memory import METRICS, DirectMemoryWatch, direct_mb
from cursorsync_devtools.testbed.testbed import TestBedError

MB = 2**20


def _client(answers: dict[str, list[httpx.Response]]) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == METRICS
        queue = answers[request.url.host]
        return queue.pop(0) if len(queue) > 1 else queue[0]
    return httpx.Client(transport=httpx.MockTransport(handle))


def _used(mb: int) -> httpx.Response:
    return httpx.Response(200, text=(
        "# TYPE jvm_memory_direct_bytes_used gauge\n"
        f'jvm_memory_direct_bytes_max{{cluster="a"}} {384 * MB:.8E}\n'
        f'jvm_memory_direct_bytes_used{{cluster="a"}} {mb * MB:.8E}\n'))


def test_the_peak_is_the_largest_read_of_each_broker() -> None:
    http = _client({"a": [_used(16), _used(92), _used(80)],
                    "b": [_used(56), httpx.Response(500), _used(64)]})
    watch = DirectMemoryWatch({"a": "http://a/", "b": "http://b"}, http=http)
    for _ in range(3):
        watch.read()
    assert watch.peaks() == {"a": 92.0, "b": 64.0}


def test_a_broker_that_never_answers_has_no_peak() -> None:
    http = _client({"a": [_used(10)], "b": [httpx.Response(503)]})
    with DirectMemoryWatch({"a": "http://a", "b": "http://b"}, every_s=0.01, http=http) as w:
        pass
    assert w.peaks() == {"a": 10.0, "b": None}


def test_an_answer_without_the_figure_is_named() -> None:
    with pytest.raises(TestBedError, match="cluster b: /metrics/ without"):
        direct_mb("b", "jvm_memory_direct_bytes_max 4.0E8\n")
    assert direct_mb("a", "jvm_memory_direct_bytes_used 3145728.0\n") == 3.0


def test_a_wide_run_that_fails_keeps_its_error_and_the_memory_peak(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import cursorsync_devtools.demo as demo_module
    import cursorsync_devtools.testbed.direct_memory as watch_module
    from cursorsync_devtools import bench_partitions

    class Cluster:
        pid = None

    class Bed:
        def __init__(self) -> None:
            self.clusters = {"a": Cluster(), "b": Cluster()}

        def admin_url(self, name: str) -> str:
            return f"http://{name}"

    def broker_gone(**_: object) -> None:
        raise RuntimeError("Timeout: Pulsar error: TimeOut\nmore")

    monkeypatch.setattr(demo_module, "demo", broker_gone)
    http = _client({"a": [_used(380)], "b": [httpx.Response(503)]})
    monkeypatch.setattr(watch_module, "DirectMemoryWatch",
                        lambda urls: DirectMemoryWatch(urls, every_s=0.01, http=http))
    got = bench_partitions._run(Bed(), tmp_path, 4, 2, 1.0, 10.0, "probe")
    assert got == {"holes": "probe", "failed": "Timeout: Pulsar error: TimeOut",
                   "direct_mb_peak": {"a": 380.0, "b": None}}

