"""A real S3 API on loopback for the object-storage tests: SeaweedFS's ``weed server -s3``.

The binary comes from :mod:`cursorsync_devtools.testbed.seaweedfs` (built once into the
cache, about 9 minutes on 2 cores). The tests that need it run with ``CURSORSYNC_S3=1``
(which builds weed once); otherwise they are skipped, saying so. The server knows one
identity, so a request signed with other keys is refused: a test that reads and
writes proves the credentials reached the client.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from cursorsync_devtools.testbed.distribution import SetupError
from cursorsync_devtools.testbed.seaweedfs import cached_weed, ensure_weed
from cursorsync_devtools.testbed.standalone import LOOPBACK, free_port

#: Set to 1 to build ``weed`` when it is not cached (about 9 minutes on 2 cores).
S3_ENV = "CURSORSYNC_S3"
ACCESS_KEY = "cursorsync-test"
SECRET_KEY = "cursorsync-test-secret"
_SERVERS = ("master", "volume", "filer", "s3")


def weed_or_skip() -> Path:
    """The ``weed`` binary when CURSORSYNC_S3=1 asks for the S3 tests (the cached one, or
    built now); skips the test (saying why) otherwise, or when the build fails. The S3
    tests take about 7 minutes on 2 cores, so the default run leaves them out."""
    if os.environ.get(S3_ENV) != "1":
        pytest.skip(f"the S3 tests run with {S3_ENV}=1 (about 7 minutes on 2 cores; the "
                    "first run builds SeaweedFS's weed, about 9 minutes more)")
    cached = cached_weed()
    if cached is not None:
        return cached
    try:
        return ensure_weed()
    except SetupError as err:
        pytest.skip(f"SeaweedFS's weed could not be built: {err}")


@dataclass(frozen=True)
class S3Server:
    """A running SeaweedFS S3 gateway: where it answers and the one identity it accepts."""

    endpoint: str
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = "us-east-1"

    def credentials_env(self) -> dict[str, str]:
        """The standard AWS variables both Spark's s3a and delta-rs read."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}

    def create_bucket(self, name: str) -> None:
        from pyarrow.fs import S3FileSystem

        fs = S3FileSystem(access_key=self.access_key, secret_key=self.secret_key,
                          endpoint_override=self.endpoint, scheme="http", region=self.region,
                          allow_bucket_creation=True)
        fs.create_dir(name)

    def objects(self, bucket: str, prefix: str) -> list[str]:
        """Keys under ``prefix`` in ``bucket`` (recursively)."""
        from pyarrow.fs import FileSelector, FileType, S3FileSystem

        fs = S3FileSystem(access_key=self.access_key, secret_key=self.secret_key,
                          endpoint_override=self.endpoint, scheme="http", region=self.region)
        infos = fs.get_file_info(FileSelector(f"{bucket}/{prefix}", recursive=True,
                                              allow_not_found=True))
        return sorted(i.path for i in infos if i.type == FileType.File)


def _identity_config(path: Path) -> Path:
    path.write_text(json.dumps({"identities": [{
        "name": "cursorsync",
        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }]}))
    return path


def _ports() -> dict[str, int]:
    """A free loopback port per listener flag (``master.port``, ``master.port.grpc``, ...):
    left to itself, a server takes its HTTP port plus 10000 for gRPC, which may be taken."""
    names = [f"{s}.port{suffix}" for s in _SERVERS for suffix in ("", ".grpc")]
    ports: dict[str, int] = {}
    while len(ports) < len(names):
        port = free_port()
        if port not in ports.values():
            ports[names[len(ports)]] = port
    return ports


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(endpoint + "/", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # an S3 error (no credentials) is an answer
    except OSError:
        return False


@contextmanager
def seaweedfs_s3(work_dir: Path, *, timeout_s: float = 60.0) -> Iterator[S3Server]:
    """``weed server`` (master, volume, filer, S3 gateway) on free loopback ports, its data
    and log under ``work_dir``; stopped on exit."""
    weed = weed_or_skip()
    data = work_dir / "seaweedfs"
    data.mkdir(parents=True, exist_ok=True)
    ports = _ports()
    cmd = [str(weed), "server", f"-ip={LOOPBACK}", f"-ip.bind={LOOPBACK}", f"-dir={data}",
           "-master.volumeSizeLimitMB=64", "-volume.max=0",
           "-filer", "-s3", f"-s3.config={_identity_config(work_dir / 's3.json')}",
           "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
           *(f"-{flag}={port}" for flag, port in ports.items())]
    log_path = work_dir / "seaweedfs.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    endpoint = f"http://{LOOPBACK}:{ports['s3.port']}"
    try:
        deadline = time.monotonic() + timeout_s
        while not _answers(endpoint):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise AssertionError(f"weed server did not answer S3 on {endpoint} within "
                                     f"{timeout_s:.0f} s (exit {proc.poll()}); {log_path}:\n"
                                     f"{tail}")
            time.sleep(0.5)
        yield S3Server(endpoint)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
