"""Opening a pulsar-client: the one place that chooses its logger.

The C++ client keeps the logger factory of the FIRST client made in a process
for every client after it, whatever logger those are given. A Python
``logging.Logger`` handed to it answers "enabled" for every level, so each
DEBUG line of the C++ core (one per message received, among others) takes
the GIL from an I/O thread, creates and frees a Python thread state, and
calls a logger that then drops the line: several times the CPU of the read
itself, most of it in the kernel (futex waits on the GIL, a thread-state stack
mapped and unmapped per call). So every client here is opened with a C++ file
logger that filters in C++ (WARN and above) and writes into a pipe; a Python
thread reads the pipe and logs each line on the ``pulsar`` logger. The
client's warnings so come out in cursorsync's own log format (JSON lines when
logs are JSON), and Python runs only for the lines that are kept.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass
from typing import Any

#: The Python logger the C++ client's lines are logged on.
CLIENT_LOGGER = "pulsar"

#: A line of the C++ client's file logger:
#: ``2025-01-02 03:04:05.678 WARN  [140226] ClientConnection:1234 | message``.
_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ (?P<level>[A-Z]+)\s+"
                   r"\[(?P<thread>[^\]]*)\] (?P<source>\S+) \| (?P<msg>.*)$")
_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "ERROR": logging.ERROR}


def log_client_line(line: str, logger: logging.Logger | None = None) -> None:
    """Log one line of the C++ client's log as a record: its level and message, and
    where in the client it comes from (``source``, e.g. ``ClientConnection:1234``)."""
    logger = logger or logging.getLogger(CLIENT_LOGGER)
    line = line.rstrip("\r\n")
    if not line.strip():
        return
    match = _LINE.match(line)
    if match is None:  # a message that spans lines: its later lines as they are
        logger.warning(line)
        return
    level = _LEVELS.get(match["level"], logging.WARNING)
    logger.log(level, match["msg"], extra={"source": match["source"]})


class _PipeLog:
    """The pipe the C++ logger writes into, and the thread that logs what it reads.

    One per process (the C++ client keeps its first logger); a forked child makes its
    own, since the parent's thread does not survive the fork."""

    _lock = threading.Lock()
    _pid: int | None = None
    _path: str | None = None

    @classmethod
    def path(cls) -> str | None:
        """The path the C++ logger opens (the pipe's write end), or None off Linux."""
        with cls._lock:
            if cls._pid != os.getpid():
                cls._pid, cls._path = os.getpid(), cls._open()
            return cls._path

    @staticmethod
    def _open() -> str | None:
        if not os.path.isdir("/proc/self/fd"):
            return None
        read_fd, write_fd = os.pipe()
        os.set_inheritable(write_fd, False)
        thread = threading.Thread(target=_PipeLog._read, args=(read_fd,),
                                  name="pulsar-client-log", daemon=True)
        thread.start()
        return f"/proc/{os.getpid()}/fd/{write_fd}"

    @staticmethod
    def _read(fd: int) -> None:
        with open(fd, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                log_client_line(line)


def client_logger() -> Any:
    """A logger the C++ client filters itself (WARN and up, or ERROR and up when
    cursorsync logs only errors), writing into the pipe whose lines are logged."""
    import pulsar

    quiet = logging.getLogger().getEffectiveLevel() >= logging.ERROR
    level = pulsar.LoggerLevel.Error if quiet else pulsar.LoggerLevel.Warn
    path = _PipeLog.path()
    if path is not None:
        return pulsar.FileLogger(level, path)
    return pulsar.ConsoleLogger(level)  # no /proc (not Linux): its own lines on stdout


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
