"""The ``cursorsync`` command line's plumbing: the Typer app, the global options, the
error handling every command shares, and the lazy loading of heavy modules.

The contract every command keeps: results on stdout, logs and diagnostics on stderr;
exit status 0 when it did what was asked, 1 when the answer is no (``status --ready``
not ready, ``lookup`` not mapped), 2 on any error (a bad option, a bad config, an
unreachable cluster, a busy port, anything unexpected), with exactly one ``error: ...``
line on stderr, and its traceback only with ``--log-level debug``; 130 when interrupted.
"""


from __future__ import annotations

import functools
import importlib
import logging
import sys
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer

# typer 0.29 carries its own copy of click (pyproject pins typer), whose exceptions these
# are; the click package's would never match.
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
from typer.core import TyperGroup

from cursorsync.app.logs import configure_logging, echo
from cursorsync.errors import CursorSyncError

if TYPE_CHECKING:
    from cursorsync.app.settings import Config
    from cursorsync.tables import TableStore

P = ParamSpec("P")
R = TypeVar("R")

log = logging.getLogger(__name__)

#: Exit status of every error: one the user can act on, a usage error (as click's), an
#: environment that fails the command, anything unexpected.
EXIT_USER_ERROR = 2
#: Exit status when the answer is no: not ready (status --ready), not mapped (lookup).
EXIT_NOT_FOUND = 1
EXIT_INTERRUPTED = 130

CONFIG_ENV = "CURSORSYNC_CONFIG"


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"
    critical = "critical"


@dataclass(frozen=True)
class _State:
    """What the global options decided, for the commands."""

    log_level: str | None = None
    log_json: bool | None = None

    @property
    def debug(self) -> bool:
        return self.log_level == LogLevel.debug.value


def examples(*lines: str) -> str:
    """A command's help epilog: example command lines, kept as written (``\\b`` stops
    click from rewrapping them)."""
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)


class _Group(TyperGroup):
    """The command group, with every failure click itself reports (a usage error, a bad
    option value) as one ``error: ...`` line too, and anything a command lets escape as
    one line rather than a traceback."""

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode,
                                windows_expand_args, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False,
                                windows_expand_args, **extra)
        except NoArgsIsHelpError as exc:
            exc.show()
            _error_line("no command given")
            sys.exit(EXIT_USER_ERROR)
        except UsageError as exc:
            _error_line(_usage_message(exc))
            sys.exit(EXIT_USER_ERROR)
        except ClickException as exc:
            _error_line(exc.format_message())
            sys.exit(exc.exit_code or EXIT_USER_ERROR)
        except typer.Abort:
            _error_line("aborted")
            sys.exit(EXIT_INTERRUPTED)
        except Exception as exc:  # escaped a command, or from the global options
            try:
                report(exc)
            except typer.Exit as done:
                code = done.exit_code
        sys.exit(code if isinstance(code, int) else 0)


def _usage_message(exc: UsageError) -> str:
    """Click's message in one line, with where the usage is (click prints three lines)."""
    text = " ".join(exc.format_message().split())
    message = (text[:1].lower() + text[1:]).rstrip(".")
    bad = message.removeprefix("no such command ").strip("'\"")
    if message.startswith("no such command") and bad.lower() in _BOOL_WORDS:
        message += " (flags take no value: write --flag or --no-flag, not --flag true)"
    path = exc.ctx.command_path if exc.ctx is not None else "cursorsync"
    return f"{message} (`{path} --help` shows the usage)"


_BOOL_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0"})


app = typer.Typer(
    name="cursorsync",
    cls=_Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: no boxes, no <bool> beside flags, and examples kept as written.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


# ------------------------------------------------------------------ plumbing


#: Set by the global options callback; commands read it (click's context is not
#: always current while a command body runs under typer).
_STATE: ContextVar[_State | None] = ContextVar("cursorsync_cli_state", default=None)


def cli_state() -> _State:
    return _STATE.get() or _State()


def _error_line(message: str, exc: BaseException | None = None) -> None:
    """The one ``error: ...`` line of a failure, on stderr (a config's several problems
    follow it, one indented line each); with JSON logs, one JSON object per line, the
    traceback in the first when debugging."""
    echo(f"error: {message.rstrip() or 'failed'}", level="error", exc=exc)


def fail(message: str, exc: BaseException | None = None,
         code: int = EXIT_USER_ERROR) -> NoReturn:
    """Print ``error: <message>`` (and the traceback when debugging) and exit ``code``."""
    _error_line(message, exc if cli_state().debug else None)
    raise typer.Exit(code)


def report(exc: Exception) -> NoReturn:
    """Fail with an exception's one line: ours say what to fix; anything else is named by
    its type (an OSError by its file too), with where to find more."""
    if isinstance(exc, CursorSyncError):
        fail(str(exc), exc)
    if isinstance(exc, OSError) and exc.strerror:
        what = exc.strerror + (f": {exc.filename!r}" if exc.filename is not None else "")
    elif isinstance(exc, OSError):  # a storage engine's (delta-rs, pyarrow): its lines say
        # what was refused and where, so all of them, as one
        what = " ".join(str(exc).split())[:1000] or "(no message)"
    else:  # its first line: a Py4J error's text carries the whole Java stack trace
        what = next((line.strip() for line in str(exc).splitlines() if line.strip()),
                    "(no message)")
    fail(f"{type(exc).__name__}: {what} (unexpected; `cursorsync --log-level debug ...` "
         "prints the traceback)", exc)


def user_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn every error into one ``error: ...`` line and exit 2, and Ctrl-C into exit 130;
    typer's and click's own exits pass."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, ClickException):
            raise
        except KeyboardInterrupt:
            _error_line("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except Exception as exc:
            report(exc)

    return wrapper


def load_lazily(module: str, attr: str, command: str) -> Any:
    """Import ``module.attr`` lazily; a missing module is a clear error, not a traceback."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            fail(f"`{command}` is not available: this installation has no {exc.name} module "
                 "(reinstall cursorsync)", exc)
        fail(f"`{command}` needs the Python module {exc.name!r}, which is not installed "
             "(reinstall cursorsync)", exc)
    try:
        return getattr(mod, attr)
    except AttributeError as exc:
        fail(f"`{command}` is not available: {module} has no {attr}", exc)


def load_config_file(path: Path) -> Config:
    from cursorsync.app.settings import load_config

    return load_config(path)


def query_store(config: Config) -> TableStore:
    from cursorsync.tables import open_reader

    return open_reader(config.tables.path, storage_options=dict(config.tables.storage_options))


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"cursorsync {version('cursorsync')}")
        except PackageNotFoundError:
            typer.echo("cursorsync (not installed as a package)")
        raise typer.Exit()


# ------------------------------------------------------------------ global options

ConfigOption = Annotated[
    Path,
    typer.Option(
        "--config", "-c", envvar=CONFIG_ENV, show_envvar=True, dir_okay=False,
        help="The YAML config (conf/embedded.yaml and conf/production.example.yaml are examples).",
    ),
]
JsonOption = Annotated[bool, typer.Option(
    "--json", help="Print the result as one JSON document (the shapes: docs/operation.md).")]
LogLevelOption = Annotated[
    LogLevel | None,
    typer.Option(
        "--log-level", case_sensitive=False,
        help="Log level (default warning; `run` defaults to the config's logging.level). "
             "debug also prints the traceback of an error.",
    ),
]
LogJsonOption = Annotated[
    bool | None,
    typer.Option("--log-json/--no-log-json", show_default=False,
                 help="Log one JSON object per line, or plain lines (on stderr; `run` "
                      "defaults to the config's logging.json, the others to plain)."),
]


def apply_global_options(ctx: typer.Context, log_level: LogLevel | None,
                         log_json: bool | None) -> None:
    """Record the global options for the commands and set up logging (on stderr)."""
    state = _State(None if log_level is None else log_level.value, log_json)
    ctx.obj = state
    _STATE.set(state)
    configure_logging(state.log_level or "warning", json=bool(log_json))


@app.callback(epilog=examples(
    "cursorsync check -c cursorsync.yaml",
    "cursorsync run -c cursorsync.yaml",
    "CURSORSYNC_CONFIG=cursorsync.yaml cursorsync status --ready --json",
    "cursorsync --log-level debug --log-json run -c cursorsync.yaml --once",
))
def _global_options(
    ctx: typer.Context,
    log_level: LogLevelOption = None,
    log_json: LogJsonOption = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True,
                     help="Print the version and exit."),
    ] = False,
) -> None:
    """Keep geo-replicated Pulsar subscriptions in step across two clusters.

    Results go to stdout; logs, progress and errors to stderr. Exit status: 0 done;
    1 the answer is no (status --ready: not ready; lookup: not mapped); 2 an error,
    said in one `error: ...` line (--log-level debug adds its traceback); 130
    interrupted.
    """
    apply_global_options(ctx, log_level, log_json)

