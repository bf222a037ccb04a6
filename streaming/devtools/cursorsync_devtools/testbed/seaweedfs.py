"""SeaweedFS's ``weed`` (Apache-2.0), built once from the Go module proxy into the cache.

The object-storage tests run the job against a real S3 API on loopback: SeaweedFS's S3
gateway. ``go install github.com/seaweedfs/seaweedfs/weed@<version>`` is refused (its
go.mod has a replace directive), so the build is a module of our own that requires
SeaweedFS at a pinned version, repeats its replace, and builds its ``weed`` package.
That takes about 9 minutes on 2 cores and yields a binary of about 230 MB, kept at
``<cache>/seaweedfs/<version>/weed``; every later run reuses it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cursorsync_devtools.testbed.distribution import SetupError, cache_dir

SEAWEEDFS_MODULE = "github.com/seaweedfs/seaweedfs"
#: A commit of SeaweedFS as the Go module proxy names it (``weed version``: 4.53).
SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
#: SeaweedFS's own go.mod replaces this module; a replace applies only in the main
#: module, so ours repeats it (without it the build does not resolve).
_REPLACES = ("github.com/tyler-smith/go-bip39 => github.com/cosmos/go-bip39 v1.0.0",)
#: Nine minutes on 2 cores; a busy machine may take several times that.
_BUILD_TIMEOUT_S = 3600.0


def weed_path(version: str = SEAWEEDFS_VERSION) -> Path:
    """Where the built ``weed`` of ``version`` lives in the cache (it may not exist yet)."""
    return cache_dir() / "seaweedfs" / version / "weed"


def cached_weed(version: str = SEAWEEDFS_VERSION) -> Path | None:
    """The cached ``weed`` binary, or None when it has not been built."""
    path = weed_path(version)
    return path if path.is_file() and os.access(path, os.X_OK) else None


def require_go() -> str:
    """The ``go`` to build with; SetupError saying how to get one otherwise."""
    go = shutil.which("go")
    if go is None:
        raise SetupError("Go is needed to build SeaweedFS's `weed` (the S3 server the "
                         "object-storage tests run), and no `go` is on PATH. Install it, e.g. "
                         "on Debian: apt-get install golang-go")
    return go


def _module_files(version: str) -> dict[str, str]:
    replaces = "".join(f"replace {r}\n" for r in _REPLACES)
    return {
        "go.mod": f"module cursorsync.local/weedbuild\n\ngo 1.25\n\n"
                  f"require {SEAWEEDFS_MODULE} {version}\n\n{replaces}",
        "tools.go": "//go:build tools\n\npackage tools\n\n"
                    f'import _ "{SEAWEEDFS_MODULE}/weed"\n',
    }


def _run(cmd: list[str], cwd: Path, timeout_s: float) -> None:
    env = {**os.environ, "CGO_ENABLED": os.environ.get("CGO_ENABLED", "0")}
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SetupError(f"SeaweedFS: `{' '.join(cmd)}` did not finish within "
                         f"{timeout_s:.0f} s (in {cwd})") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-1200:] or "no output"
        raise SetupError(f"SeaweedFS: `{' '.join(cmd)}` failed (exit {done.returncode}) in "
                         f"{cwd}: {tail}")


def ensure_weed(version: str = SEAWEEDFS_VERSION, *, timeout_s: float = _BUILD_TIMEOUT_S) -> Path:
    """The ``weed`` binary of ``version``, built from the Go module proxy when not cached.

    Raises SetupError naming what is missing (``go``) or which step failed.
    """
    cached = cached_weed(version)
    if cached is not None:
        return cached
    go = require_go()
    target = weed_path(version)
    build = target.parent / "build"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    for name, text in _module_files(version).items():
        (build / name).write_text(text)
    print(f"SeaweedFS {version}: building weed with {go} in {build} (about 9 minutes on "
          "2 cores)", file=sys.stderr, flush=True)
    started = time.monotonic()
    deadline = started + timeout_s
    _run([go, "mod", "tidy"], build, timeout_s)
    part = target.with_name("weed.part")
    _run([go, "build", "-trimpath", "-o", str(part), f"{SEAWEEDFS_MODULE}/weed"], build,
         max(deadline - time.monotonic(), 1.0))
    part.rename(target)
    shutil.rmtree(build, ignore_errors=True)
    print(f"SeaweedFS {version}: built {target} in {time.monotonic() - started:.0f} s",
          file=sys.stderr, flush=True)
    return target
