"""``python -m cursorsync_devtools.testbed fetch``: fetch and unpack what the test bed runs (Apache
Pulsar, the Delta and S3A jars) into the cache, so that a first test run does not wait for it.
``build-weed``: build SeaweedFS's ``weed`` (the object-storage tests' S3 server) into the
cache, about 9 minutes on 2 cores."""

from __future__ import annotations

import sys

from cursorsync_devtools.testbed.delta_jars import ensure_delta_jars
from cursorsync_devtools.testbed.distribution import (
    PULSAR_VERSION,
    SetupError,
    ensure_pulsar,
    maven_repository,
)
from cursorsync_devtools.testbed.s3a_jars import ensure_s3a_jars
from cursorsync_devtools.testbed.seaweedfs import ensure_weed


def main(argv: list[str]) -> int:
    if argv == ["build-weed"]:
        try:
            print(f"SeaweedFS weed: {ensure_weed()}")
        except SetupError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    if argv != ["fetch"]:
        print("usage: python -m cursorsync_devtools.testbed fetch | build-weed", file=sys.stderr)
        return 2
    try:
        home = ensure_pulsar()
        jars = ensure_delta_jars()
        s3a = ensure_s3a_jars()
    except SetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"Apache Pulsar {PULSAR_VERSION}: {home}")
    for jar in jars:
        print(f"Delta jar: {jar}")
    print(f"S3A jars: {len(s3a)} in {maven_repository()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
