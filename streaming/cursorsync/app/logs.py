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
from py4j/pyspark/pulsar/delta modules, which are dropped below debug.

With JSON on, every line the process writes is JSON:

* lines for the user that are not log records (the preflight's findings, the
  final ``error:`` line) go through :func:`echo`, shown whatever the level;
* an exception nothing caught is one record (level critical, its traceback in ``exc``);
* the pulsar client's C++ log arrives as records of the ``pulsar`` logger
  (cursorsync.pulsar.client routes it);
* the Spark JVM logs through a JSON log4j2 layout (cursorsync.app.session
  chooses it by :func:`json_output`), and whatever else a local JVM writes
  (the launcher's own warnings, its Python workers' output) passes
  :func:`relay_output`: JSON lines as they are, any other line as a record.
"""

from __future__ import annotations

import json as _json
import logging
import re
import sys
import threading
import traceback
import warnings
from collections.abc import Iterable
from datetime import UTC, datetime
from types import TracebackType
from typing import IO, Any, Literal, TextIO, get_args

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


#: The logger of the lines :func:`echo` prints (the preflight, the final error).
CLI_LOGGER = "cursorsync.cli"
#: The logger of the lines a local Spark JVM writes outside its log4j layout.
JVM_LOGGER = "spark.jvm"

_default_hooks = (sys.excepthook, threading.excepthook)


def json_output() -> bool:
    """Whether our handler writes JSON lines (:func:`configure_logging` with ``json``):
    what the Spark session's log4j layout follows, so the JVM's lines match ours."""
    return any(isinstance(h.formatter, JsonFormatter) for h in _our_handlers())


def configure_logging(
    level: str | int = "warning", json: bool = False, *, stream: TextIO | None = None
) -> None:
    """Install cursorsync's handler on the root logger (replacing an earlier one of ours).

    ``level`` applies to the root logger and so to cursorsync's own loggers;
    the libraries in :data:`NOISY_LOGGERS` stay at WARNING or above.
    ``stream`` pins the output (default: the current ``sys.stderr``).
    With ``json``, an exception nothing catches is logged as one record too.
    """
    number = parse_level(level)
    root = logging.getLogger()
    for old in _our_handlers():
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
    sys.excepthook, threading.excepthook = (
        (_log_uncaught, _log_uncaught_in_thread) if json else _default_hooks)


def _our_handlers() -> list[logging.Handler]:
    return [h for h in logging.getLogger().handlers if getattr(h, _HANDLER_MARK, False)]


def _log_uncaught(kind: type[BaseException], exc: BaseException,
                  tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt) or not json_output():
        _default_hooks[0](kind, exc, tb)
        return
    logging.getLogger(CLI_LOGGER).critical(
        "%s: %s", kind.__name__, exc, exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if not json_output():
        _default_hooks[1](args)
        return
    if args.exc_value is None or issubclass(args.exc_type, SystemExit):
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger(CLI_LOGGER).critical(
        "thread %s: %s: %s", name, args.exc_type.__name__, args.exc_value,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def _format_record(record: logging.LogRecord) -> str:
    """``record`` as our handler would write it (JSON or text)."""
    handlers = _our_handlers()
    if handlers and handlers[-1].formatter is not None:
        return handlers[-1].formatter.format(record)
    return (JsonFormatter() if json_output() else KeyValueFormatter()).format(record)


def _write_line(line: str, *, err: bool) -> None:
    """One line to stderr (or stdout), under our handler's lock so that lines of
    different threads never interleave."""
    handlers = _our_handlers()
    lock = handlers[-1].lock if handlers else None
    stream = sys.stderr if err else sys.stdout
    if lock is not None:
        with lock:
            stream.write(line + "\n")
            stream.flush()
    else:
        stream.write(line + "\n")
        stream.flush()


def echo(message: str, *, err: bool = True, level: LevelName = "info",
         exc: BaseException | None = None, **fields: Any) -> None:
    """Lines for the user that are not log records (the preflight's findings, the final
    ``error:`` line): shown whatever the log level, as they are, or with JSON logs one
    JSON object per line (logger :data:`CLI_LOGGER`, ``fields`` beside ``msg``).

    ``exc`` adds its traceback: before the line in text, as ``exc`` in JSON.
    """
    lines = message.split("\n")
    if not json_output():
        if exc is not None:
            traceback.print_exception(exc, file=sys.stderr)
        for line in lines:
            _write_line(line, err=err)
        return
    number = parse_level(level)
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        record = logging.getLogger(CLI_LOGGER).makeRecord(
            CLI_LOGGER, number, "(echo)", 0, line, (), None, extra=fields or None)
        if last and exc is not None:
            record.exc_info = (type(exc), exc, exc.__traceback__)
        _write_line(_format_record(record), err=err)


#: A leading level word in a line from outside Python logging ("WARNING: ...").
_LEVEL_PREFIX = re.compile(r"^\s*\[?(DEBUG|INFO|WARN|WARNING|ERROR|FATAL|SEVERE)\b\]?:?\s*",
                           re.IGNORECASE)
_PREFIX_LEVEL = {"warn": logging.WARNING, "fatal": logging.CRITICAL,
                 "severe": logging.ERROR}


def foreign_line_record(line: str, logger: str) -> logging.LogRecord:
    """A record for one line written outside any logging framework: its level from a
    leading level word, else WARNING (anything a JSON process writes unstructured is
    worth a look)."""
    number = logging.WARNING
    match = _LEVEL_PREFIX.match(line)
    if match:
        word = match.group(1).lower()
        number = _PREFIX_LEVEL.get(word) or parse_level(word)
    return logging.getLogger(logger).makeRecord(logger, number, "(output)", 0, line, (), None)


def _is_json_object(line: str) -> bool:
    if not line.startswith("{"):
        return False
    try:
        return isinstance(_json.loads(line), dict)
    except ValueError:
        return False


def relay_lines(lines: Iterable[str], logger: str) -> None:
    """Pass each line on to stderr: a JSON object as it is, any other line as a record of
    ``logger`` in our format. Blank lines are dropped."""
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        if _is_json_object(line):
            _write_line(line, err=True)
        else:
            _write_line(_format_record(foreign_line_record(line, logger)), err=True)


def relay_output(stream: IO[bytes], logger: str = JVM_LOGGER) -> threading.Thread:
    """Relay a child process's output (a pipe) on a daemon thread, until it closes."""
    def run() -> None:
        with stream:
            relay_lines((b.decode("utf-8", "replace") for b in stream), logger)

    thread = threading.Thread(target=run, name=f"relay-{logger}", daemon=True)
    thread.start()
    return thread


__all__ = [
    "CLI_LOGGER",
    "JVM_LOGGER",
    "LEVELS",
    "NOISY_LOGGERS",
    "PULSAR_LOGGER",
    "JsonFormatter",
    "KeyValueFormatter",
    "LevelName",
    "configure_logging",
    "echo",
    "extra_fields",
    "foreign_line_record",
    "json_output",
    "parse_level",
    "relay_lines",
    "relay_output",
]
