"""The ``cursorsync`` command line's plumbing: the Typer app, the global options, the
error handling every command shares, and the lazy loading of heavy modules."""


from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer

from cursorsync.app.logs import configure_logging, echo
from cursorsync.errors import CursorSyncError

if TYPE_CHECKING:
    from cursorsync.app.settings import Config
    from cursorsync.tables import TableStore

P = ParamSpec("P")
R = TypeVar("R")

log = logging.getLogger(__name__)

#: Exit status for errors the user can act on (same as a command-line usage error).
EXIT_USER_ERROR = 2
#: Exit status when a query found nothing / a check failed (lookup).
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


app = typer.Typer(
    name="cursorsync",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


# ------------------------------------------------------------------ plumbing


#: Set by the global options callback; commands read it (click's context is not
#: always current while a command body runs under typer).
_STATE: ContextVar[_State | None] = ContextVar("cursorsync_cli_state", default=None)


def cli_state() -> _State:
    return _STATE.get() or _State()


def fail(message: str, exc: BaseException | None = None) -> NoReturn:
    """Print ``error: <message>`` (and the traceback when debugging) and exit 2."""
    echo(f"error: {message}", level="error", exc=exc if cli_state().debug else None)
    raise typer.Exit(EXIT_USER_ERROR)


def user_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn our errors into ``error: ...`` + exit 2, and Ctrl-C into exit 130."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except CursorSyncError as exc:
            fail(str(exc), exc)
        except KeyboardInterrupt:
            echo("interrupted", level="warning")
            raise typer.Exit(EXIT_INTERRUPTED) from None

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
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
LogLevelOption = Annotated[
    LogLevel | None,
    typer.Option(
        "--log-level", case_sensitive=False,
        help="Log level (default warning; `run` defaults to the config's logging.level). "
             "debug also prints the traceback of an error.",
    ),
]
LogJsonOption = Annotated[
    bool | None, typer.Option("--log-json", help="Log one JSON object per line (on stderr).")
]


def apply_global_options(ctx: typer.Context, log_level: LogLevel | None,
                         log_json: bool | None) -> None:
    """Record the global options for the commands and set up logging (on stderr)."""
    state = _State(None if log_level is None else log_level.value, log_json)
    ctx.obj = state
    _STATE.set(state)
    configure_logging(state.log_level or "warning", json=bool(log_json))


@app.callback()
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

    Results go to stdout, logs and errors to stderr. Exit status 2 means an error
    you can fix (the message says what); see each command's help for 1.
    """
    apply_global_options(ctx, log_level, log_json)

