"""Apache Pulsar's server distribution from Maven Central, fetched once and cached.

The test bed runs the real broker: ``org.apache.pulsar:pulsar-server-distribution``
(classifier ``bin``, a tar.gz holding ``bin/pulsar``, ``conf/`` and ``lib/``),
fetched with Maven into a local repository under the cache directory, checked,
and unpacked there once. Every later start reuses the unpacked copy.

The cache directory is ``$CURSORSYNC_CACHE_DIR``, else ``~/.cache/cursorsync``.
Java 17 runs the brokers and Maven fetches them; a missing one, or a failed
download, is one :class:`SetupError` saying what to install or what failed.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cursorsync.errors import CursorSyncError

#: The newest 4.0.x (LTS) release Maven Central serves; it stamps
#: ``__MSG_PROP_REPL_SOURCE_POSITION`` on replicated entries (4.0.4 and later).
PULSAR_VERSION = "4.0.8"
#: SHA-512 of the distribution as Maven Central serves it (Maven itself checks the
#: SHA-1 Central publishes beside it, with ``--strict-checksums``).
PULSAR_SHA512 = {
    "4.0.8": "65b769b10696cdfebf7fc5bcdc95dd663702e27051e616c1a13cb100e91279525be35352171bef"
             "e7b0011176330aab29bd0a6c8a0f2f0646641af46d2e33cbd6",
}
#: Maven 3.8's bundled dependency plugin is 2.x; ``copy`` with a classifier needs 3.x.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
JAVA_MAJOR = 17


class SetupError(CursorSyncError):
    """Something the test bed needs is missing or could not be fetched; says what to do."""


@dataclass(frozen=True)
class Artifact:
    """A Maven coordinate: ``group:artifact:version[:packaging[:classifier]]``."""

    group: str
    artifact: str
    version: str
    packaging: str = "jar"
    classifier: str | None = None

    def coordinate(self) -> str:
        tail = f":{self.packaging}" + (f":{self.classifier}" if self.classifier else "")
        return f"{self.group}:{self.artifact}:{self.version}{tail}"

    def file_name(self) -> str:
        suffix = f"-{self.classifier}" if self.classifier else ""
        return f"{self.artifact}-{self.version}{suffix}.{self.packaging}"

    def repository_path(self, repo: Path) -> Path:
        """Where Maven keeps it in a local repository."""
        return (repo.joinpath(*self.group.split(".")) / self.artifact / self.version
                / self.file_name())


def pulsar_artifact(version: str = PULSAR_VERSION) -> Artifact:
    return Artifact("org.apache.pulsar", "pulsar-server-distribution", version, "tar.gz", "bin")


def cache_dir() -> Path:
    """Where fetched artifacts live: ``$CURSORSYNC_CACHE_DIR`` or ``~/.cache/cursorsync``."""
    env = os.environ.get("CURSORSYNC_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "cursorsync"


def maven_repository() -> Path:
    """The local Maven repository the test bed fetches into (inside the cache)."""
    return cache_dir() / "m2"


def require_java(minimum: int = JAVA_MAJOR) -> str:
    """The ``java`` to run brokers with (``$JAVA_HOME/bin/java`` or on PATH), at least
    ``minimum``; SetupError otherwise."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        raise SetupError(f"Java {minimum} is needed to run Apache Pulsar and Spark, and no "
                         "`java` was found (JAVA_HOME or PATH). Install it, e.g. on Debian: "
                         f"apt-get install openjdk-{minimum}-jdk-headless")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    major = 0 if m is None else int(m.group(2) if m.group(1) == "1" else m.group(1))
    if major < minimum:
        raise SetupError(f"{java} is Java {major or '(unknown)'}; Apache Pulsar {PULSAR_VERSION} "
                         f"needs Java {minimum} or later (apt-get install "
                         f"openjdk-{minimum}-jdk-headless, or set JAVA_HOME)")
    return java


def require_maven() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SetupError("Maven is needed to fetch Apache Pulsar and the Delta jars from Maven "
                         "Central, and no `mvn` is on PATH. Install it, e.g. on Debian: "
                         "apt-get install maven")
    return mvn


def _show_progress(part: Path, total: int | None, label: str, stop: threading.Event) -> None:
    """Print how much of ``part`` (Maven's download file) has arrived, until stopped."""
    shown = -1
    while not stop.wait(1.0):
        try:
            size = part.stat().st_size
        except OSError:
            continue
        mb = size // (1 << 20)
        if mb == shown:
            continue
        shown = mb
        of = f" of {total / (1 << 20):.0f}" if total else ""
        print(f"\r{label}: {mb}{of} MiB", end="", file=sys.stderr, flush=True)
    if shown >= 0:
        print(file=sys.stderr, flush=True)


def maven_fetch(artifacts: Sequence[Artifact], *, label: str, expected_size: int | None = None,
                timeout_s: float = 1800.0) -> list[Path]:
    """Each artifact's file in the local repository, fetched from Maven Central when absent.

    Maven runs with ``--strict-checksums`` (a download whose SHA-1 does not match what
    Central publishes fails). While it runs, the size of the first artifact's partial
    file is shown on stderr.
    """
    repo = maven_repository()
    paths = [a.repository_path(repo) for a in artifacts]
    missing = [a for a, p in zip(artifacts, paths, strict=True) if not p.is_file()]
    if not missing:
        return paths
    mvn = require_maven()
    require_java()
    repo.mkdir(parents=True, exist_ok=True)
    print(f"{label}: fetching {', '.join(a.coordinate() for a in missing)} from Maven Central "
          f"into {repo}", file=sys.stderr, flush=True)
    stop = threading.Event()
    part = missing[0].repository_path(repo).with_name(missing[0].file_name() + ".part")
    shower = threading.Thread(target=_show_progress, args=(part, expected_size, label, stop),
                              daemon=True)
    shower.start()
    try:
        for a in missing:
            cmd = [mvn, "-B", "-q", "--strict-checksums", f"-Dmaven.repo.local={repo}",
                   f"{DEPENDENCY_PLUGIN}:get", f"-Dartifact={a.coordinate()}", "-Dtransitive=false"]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                      check=False)
            except subprocess.TimeoutExpired:
                raise SetupError(f"{label}: Maven did not fetch {a.coordinate()} within "
                                 f"{timeout_s:.0f} s: {' '.join(cmd)}") from None
            if done.returncode != 0 or not a.repository_path(repo).is_file():
                detail = _maven_error(done.stdout + done.stderr)
                raise SetupError(f"{label}: Maven could not fetch {a.coordinate()} (exit "
                                 f"{done.returncode}): {detail}\ncommand: {' '.join(cmd)}")
    finally:
        stop.set()
        shower.join()
    return paths


def _maven_error(output: str) -> str:
    errors = [ln.strip() for ln in output.splitlines() if "[ERROR]" in ln and ln.strip()]
    text = " ".join(errors[:3]) or output.strip()[-600:] or "no output"
    return text[:1200]


def sha512(path: Path) -> str:
    h = hashlib.sha512()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_pulsar(version: str = PULSAR_VERSION) -> Path:
    """The unpacked distribution's home (``bin/pulsar`` inside), fetched and unpacked once."""
    home = cache_dir() / "pulsar" / f"apache-pulsar-{version}"
    done = home / ".cursorsync-unpacked"
    if done.is_file() and (home / "bin" / "pulsar").is_file():
        return home
    require_java()
    artifact = pulsar_artifact(version)
    (tarball,) = maven_fetch([artifact], label=f"Apache Pulsar {version}",
                             expected_size=245_494_718 if version == "4.0.8" else None)
    want = PULSAR_SHA512.get(version)
    if want is not None and sha512(tarball) != want:
        tarball.unlink(missing_ok=True)
        raise SetupError(f"{tarball}: its SHA-512 is not the one pinned for Apache Pulsar "
                         f"{version}; the file was removed, run again to fetch it anew")
    staging = home.with_name(home.name + ".unpacking")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    print(f"Apache Pulsar {version}: unpacking into {home.parent}", file=sys.stderr, flush=True)
    started = time.monotonic()
    with tarfile.open(tarball) as tar:
        tar.extractall(staging, filter="tar")
    (inner,) = [p for p in staging.iterdir() if p.is_dir()]
    shutil.rmtree(home, ignore_errors=True)
    inner.rename(home)
    shutil.rmtree(staging, ignore_errors=True)
    done.write_text(f"{version} unpacked in {time.monotonic() - started:.1f} s\n")
    return home
