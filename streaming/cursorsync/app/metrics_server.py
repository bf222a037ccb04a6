"""The /metrics HTTP endpoint of a registry: started on a port, stopped with the job."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import start_http_server

from cursorsync.errors import EndpointError


@dataclass(frozen=True)
class MetricsServer:
    """A running /metrics HTTP endpoint; ``stop()`` it (or use it as a context manager)."""

    host: str
    port: int
    _httpd: WSGIServer = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and release the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout_s)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_registry(registry: CollectorRegistry, port: int, host: str = "127.0.0.1"
                   ) -> MetricsServer:
    """Serve ``registry`` on host:port (port 0 = any free port); a port in use is one
    :class:`EndpointError` naming it."""
    try:
        httpd, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise EndpointError(
            exc.errno, f"cannot serve metrics on {host}:{port} (metrics.host, "
            f"metrics.port): {exc.strerror or exc}"
        ) from exc
    return MetricsServer(host=host, port=httpd.server_port, _httpd=httpd, _thread=thread)


__all__ = ["MetricsServer", "serve_registry"]
