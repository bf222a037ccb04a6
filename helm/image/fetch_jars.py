"""Put the jars jars.txt lists into a folder, each checked against its SHA-256.

The image build runs it (helm/Dockerfile) to add Delta Lake and Hadoop's S3A connector to
$SPARK_HOME/jars; the tests run it into a clean folder from the Maven repository the
test bed fetched into, and then run the job with exactly that folder's jars. Standard
library only: it runs on the base image's Python.

    python3 fetch_jars.py jars.txt DEST --maven URL
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import urllib.request
from pathlib import Path


class JarError(Exception):
    """A jar could not be fetched, or is not the one jars.txt pins; names it."""


def read_manifest(path: Path) -> list[tuple[str, str, str, str]]:
    """(group, artifact, version, sha256) per line of ``path``; ``#`` starts a comment."""
    jars = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            coordinate, digest = line.split()
            group, artifact, version = coordinate.split(":")
        except ValueError:
            raise JarError(f"{path}:{number}: expected 'group:artifact:version sha256', "
                           f"got {raw!r}") from None
        if len(digest) != 64:
            raise JarError(f"{path}:{number}: {digest!r} is not a SHA-256")
        jars.append((group, artifact, version, digest.lower()))
    return jars


def jar_url(maven: str, group: str, artifact: str, version: str) -> str:
    """Where a Maven repository (an http(s):// or file:// URL) keeps the jar."""
    return (f"{maven.rstrip('/')}/{group.replace('.', '/')}/{artifact}/{version}/"
            f"{artifact}-{version}.jar")


def fetch(manifest: Path, dest: Path, maven: str) -> list[Path]:
    """Each jar of ``manifest`` in ``dest`` (world-readable), downloaded from ``maven``
    unless a copy with the pinned SHA-256 is there already."""
    dest.mkdir(parents=True, exist_ok=True)
    placed = []
    for group, artifact, version, digest in read_manifest(manifest):
        target = dest / f"{artifact}-{version}.jar"
        if target.is_file() and _sha256(target.read_bytes()) == digest:
            placed.append(target)
            continue
        url = jar_url(maven, group, artifact, version)
        try:
            with urllib.request.urlopen(url, timeout=120) as response:
                data = response.read()
        except OSError as err:
            raise JarError(f"{group}:{artifact}:{version}: cannot fetch {url}: {err}") from None
        got = _sha256(data)
        if got != digest:
            raise JarError(f"{group}:{artifact}:{version}: {url} has SHA-256 {got}, not the "
                           f"{digest} {manifest.name} pins")
        part = target.with_name(target.name + ".part")
        part.write_bytes(data)
        os.chmod(part, 0o644)
        part.replace(target)
        placed.append(target)
    return placed


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--maven", required=True,
                        help="the Maven repository's URL (the Dockerfile's MAVEN: Maven Central)")
    args = parser.parse_args(argv)
    try:
        jars = fetch(args.manifest, args.dest, args.maven)
    except JarError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    size = sum(j.stat().st_size for j in jars)
    print(f"{len(jars)} jars, {size / 1e6:.1f} MB, in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
