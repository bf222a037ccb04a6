"""The ``cursorsync`` command line.

Commands::

    cursorsync run -c FILE [--dry-run | --no-dry-run] [--once] [--skip-check]
    cursorsync check -c FILE [--json]
    cursorsync status -c FILE [--topic T] [--subscription S] [--json] [--ready [--max-age S]]
    cursorsync lookup -c FILE TOPIC LEDGER:ENTRY [--partition I] [--json]
    cursorsync resume -c FILE --topic T --subscription S [--json]

Global options (before the command): ``--log-level``, ``--log-json / --no-log-json``,
``--version``.

Results go to stdout, logs and diagnostics to stderr. Exit status: 0 done; 1 the answer
is no (``status --ready`` not ready, ``lookup`` not mapped); 2 any error, said in one
``error: ...`` line on stderr (a traceback only with ``--log-level debug``); 130
interrupted (see :mod:`cursorsync.app.cli_base`). Spark is imported only by the commands
that need it.

The demo and the benchmarks are not here: they are the development tools' command line,
``cursorsync-dev``, in a distribution of their own.
"""

from __future__ import annotations

# Each command module registers its commands on the app when imported; the help lists
# them in this order.
# isort: off
from cursorsync.app import cli_run
from cursorsync.app import cli_tables
from cursorsync.app import cli_migrate  # noqa: F401 (registers `migrate`)
from cursorsync.app import cli_retire  # noqa: F401 (registers `retire`)
# isort: on
from cursorsync.app.cli_base import CONFIG_ENV, app

__all__ = ["CONFIG_ENV", "app", "cli_run", "cli_tables", "main"]


# ------------------------------------------------------------------ entry point


def main() -> None:
    """The ``cursorsync`` console script."""
    app(prog_name="cursorsync")


if __name__ == "__main__":
    main()
