"""Logging set-up for the command line and the job: quiet by default, JSON lines on request.

``configure_logging()`` installs one handler on the root logger, writing to
the process's *current* ``sys.stderr`` (looked up at every record, so a test
runner or a CLI runner that swaps stderr still sees the output).

Two formats:

* text (default), one concise line per record, ``extra`` fields as key=value::

      2025-01-02T03:04:05.678Z WARNING cursorsync.app.job: sync stalled subscription=billing

* JSON (``json=True``), one object per line: ``ts``, ``level``, ``logger``,
  ``msg``, then every ``extra`` field, then ``exc`` when there is a traceback::

      {"ts": "2025-01-02T03:04:05.678Z", "level": "warning", "logger": "cursorsync.app.job",
       "msg": "sync stalled", "subscription": "billing", "lag_ms": 1200}

Third-party chatter (py4j's per-command debug lines, pyspark, the pulsar
client's C++ logger) is held at WARNING or above whatever level cursorsync
itself logs at: ``--log-level debug`` is for cursorsync's own decisions.
Python warnings are logged too (logger ``py.warnings``), except those raised
from py4j/pyspark/pulsar/delta modules, which are dropped below debug. The
JVM's own log4j output is not Python logging: Spark's log level is set where
the session is built (``sc.setLogLevel`` or a log4j2 properties file).
Nor is the pulsar client's: its C++ core writes WARN and above to stderr as
plain text (cursorsync.pulsar.client says why it is not routed through Python
logging: that costs the GIL for every DEBUG line the client writes).
"""

from __future__ import annotations

import json as _json
import logging
import sys
import warnings
from datetime import UTC, datetime
from typing import Any, Literal, TextIO, get_args

from cursorsync.errors import ConfigError

LevelName = Literal["debug", "info", "warning", "error", "critical"]
LEVELS: tuple[LevelName, ...] = get_args(LevelName)

#: The pulsar Python package's own logger.
PULSAR_LOGGER = "pulsar"

#: Loggers of libraries that are chatty at INFO/DEBUG; never below WARNING.
NOISY_LOGGERS: tuple[str, ...] = (
    "py4j",
    "py4j.java_gateway",
    "py4j.clientserver",
    "pyspark",
    PULSAR_LOGGER,
    "httpx",
    "httpcore",
    "urllib3",
)

#: Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__
) | {"message", "asctime", "taskName"}

_HANDLER_MARK = "_cursorsync_handler"
#: Modules whose Python warnings are chatter for cursorsync's users.
_NOISY_WARNING_MODULES = r"(py4j|pyspark|pulsar|delta)(\..*)?$"


def parse_level(level: str | int) -> int:
    """A level name (any case; ``warn`` accepted) or number -> the logging module's number."""
    if isinstance(level, int):
        return level
    name = level.strip().lower()
    if name == "warn":
        name = "warning"
    if name not in LEVELS:
        raise ConfigError(
            f"{level!r} is not a valid log level. Valid values are: {', '.join(LEVELS)}"
        )
    return int(logging.getLevelName(name.upper()))


def _timestamp(record: logging.LogRecord) -> str:
    ts = datetime.fromtimestamp(record.created, UTC)
    return ts.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a caller passed with ``extra=``, in the order they were set."""
    return {k: v for k, v in record.__dict__.items()
            if k not in _STANDARD_ATTRS and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, extra fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in extra_fields(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = record.stack_info
        return _json.dumps(out, default=str, ensure_ascii=False)


def _kv_value(value: Any) -> str:
    text = value if isinstance(value, str) else _json.dumps(value, default=str)
    if text == "" or any(c.isspace() or c in '"=' for c in text):
        return _json.dumps(text, ensure_ascii=False)
    return text


class KeyValueFormatter(logging.Formatter):
    """``<ts> <LEVEL> <logger>: <msg> key=value ...``; values with spaces are quoted."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"]
        parts.extend(f"{k}={_kv_value(v)}" for k, v in extra_fields(record).items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + record.stack_info
        return line


class _CurrentStderrHandler(logging.StreamHandler[TextIO]):
    """A stream handler that writes to whatever ``sys.stderr`` is at emit time."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__()
        self._fixed = stream

    @property
    def stream(self) -> TextIO:
        return self._fixed if self._fixed is not None else sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        # StreamHandler.__init__ assigns sys.stderr; the property looks it up per record.
        pass


def configure_logging(
    level: str | int = "warning", json: bool = False, *, stream: TextIO | None = None
) -> None:
    """Install cursorsync's handler on the root logger (replacing an earlier one of ours).

    ``level`` applies to the root logger and so to cursorsync's own loggers;
    the libraries in :data:`NOISY_LOGGERS` stay at WARNING or above.
    ``stream`` pins the output (default: the current ``sys.stderr``).
    """
    number = parse_level(level)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    handler = _CurrentStderrHandler(stream)
    setattr(handler, _HANDLER_MARK, True)
    handler.setFormatter(JsonFormatter() if json else KeyValueFormatter())
    root.addHandler(handler)
    root.setLevel(number)
    quiet = max(number, logging.WARNING)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(quiet)
    # Python warnings become log records (same format); the libraries' own (pyspark's
    # "pandas >= 3 not fully supported" and the like) only at debug.
    logging.captureWarnings(True)
    warnings.filterwarnings(
        "default" if number <= logging.DEBUG else "ignore", module=_NOISY_WARNING_MODULES
    )


__all__ = [
    "LEVELS",
    "NOISY_LOGGERS",
    "PULSAR_LOGGER",
    "JsonFormatter",
    "KeyValueFormatter",
    "LevelName",
    "configure_logging",
    "extra_fields",
    "parse_level",
]
