"""``python -m cursorsync_devtools.testbed fetch``: fetch and unpack what the test bed runs (Apache
Pulsar, the Delta jars) into the cache, so that a first test run does not wait for it."""

from __future__ import annotations

import sys

from cursorsync_devtools.testbed.delta_jars import ensure_delta_jars
from cursorsync_devtools.testbed.distribution import PULSAR_VERSION, SetupError, ensure_pulsar


def main(argv: list[str]) -> int:
    if argv != ["fetch"]:
        print("usage: python -m cursorsync_devtools.testbed fetch", file=sys.stderr)
        return 2
    try:
        home = ensure_pulsar()
        jars = ensure_delta_jars()
    except SetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"Apache Pulsar {PULSAR_VERSION}: {home}")
    for jar in jars:
        print(f"Delta jar: {jar}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
