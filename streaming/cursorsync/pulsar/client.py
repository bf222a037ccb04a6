"""Opening a pulsar-client: the one place that chooses its logger.

The C++ client keeps the logger factory of the FIRST client made in a process
for every client after it, whatever logger those are given. A Python
``logging.Logger`` handed to it answers "enabled" for every level, so each
DEBUG line of the C++ core (one per message received, among others) takes
the GIL from an I/O thread, creates and frees a Python thread state, and
calls a logger that then drops the line: several times the CPU of the read
itself, most of it in the kernel (futex waits on the GIL, a thread-state stack
mapped and unmapped per call). So every client here is opened
with a C++ logger that writes WARN and above to stderr: the client's
warnings stay visible, as the C++ client's own plain-text lines rather than in
cursorsync's log format (see cursorsync.app.logs).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

#: Where the C++ logger writes (stderr; stdout carries ``--json`` output).
STDERR_PATH = "/dev/stderr"


def client_logger() -> Any:
    """A logger the C++ client filters itself: WARN and up, or ERROR and up when
    cursorsync logs only errors."""
    import pulsar

    quiet = logging.getLogger().getEffectiveLevel() >= logging.ERROR
    level = pulsar.LoggerLevel.Error if quiet else pulsar.LoggerLevel.Warn
    if os.path.exists(STDERR_PATH):
        return pulsar.FileLogger(level, STDERR_PATH)
    return pulsar.ConsoleLogger(level)  # no /dev/stderr (not Linux): stdout it is


def connect(service_url: str, **kwargs: Any) -> Any:
    """``pulsar.Client(service_url, **kwargs)`` with :func:`client_logger`.

    Every client cursorsync opens comes from here, so the first one made in a
    process, whose logger they all share, is never a Python logger.
    """
    import pulsar

    if "logger" in kwargs:
        raise TypeError("connect() chooses the logger itself (see cursorsync.pulsar.client)")
    return pulsar.Client(service_url, logger=client_logger(), **kwargs)


@dataclass(frozen=True)
class ClientSettings:
    """How to open a pulsar-client for one cluster: plain data, so it pickles to executors.

    Authentication is the token when there is one, else the TLS client
    certificate (mutual TLS), else none.
    """

    service_url: str
    token: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_allow_insecure: bool = False
    operation_timeout_s: int = 30
    connection_timeout_ms: int = 10_000

    def authentication(self) -> Any:
        """The pulsar-client Authentication these settings ask for, or None."""
        import pulsar

        if self.token:
            return pulsar.AuthenticationToken(self.token)
        if self.tls_cert_file and self.tls_key_file:
            return pulsar.AuthenticationTLS(self.tls_cert_file, self.tls_key_file)
        return None

    def connect(self) -> Any:
        """A new client (the caller closes it)."""
        return connect(
            self.service_url,
            authentication=self.authentication(),
            operation_timeout_seconds=self.operation_timeout_s,
            connection_timeout_ms=self.connection_timeout_ms,
            tls_trust_certs_file_path=self.tls_ca_file,
            tls_allow_insecure_connection=self.tls_allow_insecure,
        )
