"""cursorsync.pulsar.client: every client filters its log levels in C++, never in Python."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys

import pytest

pytest.importorskip("pulsar")

from cursorsync.pulsar.client import connect
from tests.support.paths import ROOT

STREAMING = ROOT / "streaming" / "cursorsync"

_UNREACHABLE = """
import logging
import pulsar
from cursorsync.pulsar.client import connect
logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s %(message)s")
client = connect("pulsar://127.0.0.1:{port}", operation_timeout_seconds=2,
                 connection_timeout_ms=500)
try:
    client.create_reader("persistent://t/n/x", pulsar.MessageId.earliest)
except pulsar.PulsarException as e:
    print("raised", type(e).__name__)
client.close()
"""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_client_warnings_reach_stderr_and_nothing_below_warn() -> None:
    """A fresh process (the logger is per process: the first client's wins). The client's
    lines reach Python logging as records of the ``pulsar`` logger, and with Python logging
    open to DEBUG, the C++ core still passes nothing below WARN."""
    out = subprocess.run([sys.executable, "-c", _UNREACHABLE.format(port=_closed_port())],
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip().startswith("raised"), out  # stdout keeps only our output
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith(("DEBUG pulsar",
             "INFO pulsar", "WARNING pulsar", "ERROR pulsar"))]
    assert any(ln.startswith(("WARNING pulsar", "ERROR pulsar")) and "Connection refused"
               in ln for ln in lines), out.stderr
    assert not [ln for ln in lines if ln.startswith(("INFO", "DEBUG"))], out.stderr


def test_connect_refuses_a_logger() -> None:
    with pytest.raises(TypeError, match="chooses the logger"):
        connect("pulsar://127.0.0.1:9", logger=None)


def test_every_client_is_opened_through_connect() -> None:
    """The first client of a process sets every client's logger: one with a Python logger
    anywhere would make the C++ core take the GIL for each of its DEBUG lines."""
    offenders = []
    for path in STREAMING.rglob("*.py"):
        if path.name == "client.py" and path.parent.name == "pulsar":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "Client"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "pulsar"):
                offenders.append(f"{path.relative_to(STREAMING)}:{node.lineno}")
    assert not offenders, f"pulsar.Client(...) outside cursorsync.pulsar.client: {offenders}"
