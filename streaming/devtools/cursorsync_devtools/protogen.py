"""Generate the Python code for proto/*.proto into cursorsync._proto, reproducibly.

Run ``python -m cursorsync_devtools.protogen`` after editing a .proto file and commit
the result; ``python -m cursorsync_devtools.protogen --check`` exits 1 (naming the
files) when the committed code no longer matches what the .proto files and
the pinned grpcio-tools produce. The generated modules are committed so that
a plain install needs no protoc at all, only the protobuf runtime.

Same inputs give the same bytes: protoc runs on file names relative to
proto/ (so no absolute path leaks into the output), in a fixed order, and the
header records the sha256 of each .proto and the compiler version instead of
a timestamp.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from cursorsync.errors import CursorSyncError

#: The .proto sources, in generation order; each gives ``<stem>_pb2.py`` and ``.pyi``.
PROTO_FILES: tuple[str, ...] = ("pulsar_markers.proto", "cursorsync.proto")

#: The source checkout's root: this file is streaming/devtools/cursorsync_devtools/protogen.py.
_ROOT = Path(__file__).resolve().parents[3]

#: proto/ in the source checkout.
PROTO_DIR = _ROOT / "proto"

#: Where the committed generated package lives.
OUT_DIR = _ROOT / "streaming" / "cursorsync" / "_proto"

_INIT_DOC = '''"""Generated protobuf modules; see cursorsync_devtools.protogen. Do not edit.

pulsar_markers_pb2: Pulsar's replicated-subscription marker payloads (proto2).
cursorsync_pb2: cursorsync's own versioned state records (proto3).
"""
'''


class ProtoGenError(CursorSyncError):
    """protoc failed or a .proto file is missing; the message carries protoc's output."""


def compiler_version() -> str:
    """``grpcio-tools X (libprotoc Y)``: part of the header, so a tool upgrade shows as drift."""
    try:
        tools = version("grpcio-tools")
    except PackageNotFoundError:
        raise ProtoGenError(
            "grpcio-tools is not installed; the development tools need it: "
            "pip install -e streaming/devtools"
        ) from None
    result = _protoc(["--version"], cwd=Path.cwd())
    return f"grpcio-tools {tools} ({result.strip()})"


def render(proto_dir: Path = PROTO_DIR) -> dict[str, bytes]:
    """The generated files (name -> bytes) for the .proto files in proto_dir."""
    missing = [name for name in PROTO_FILES if not (proto_dir / name).is_file()]
    if missing:
        raise ProtoGenError(
            f"missing .proto file(s) in {proto_dir}: {', '.join(missing)} "
            "(protogen runs from a source checkout)"
        )
    tool = compiler_version()
    out: dict[str, bytes] = {"__init__.py": _header("the .proto files in proto/", tool) +
                             _INIT_DOC.encode()}
    with tempfile.TemporaryDirectory(prefix="cursorsync-protogen-") as tmp:
        _protoc(
            ["-I.", f"--python_out={tmp}", f"--pyi_out={tmp}", *PROTO_FILES],
            cwd=proto_dir,
        )
        for name in PROTO_FILES:
            digest = hashlib.sha256((proto_dir / name).read_bytes()).hexdigest()
            header = _header(f"proto/{name} (sha256 {digest})", tool)
            stem = name.removesuffix(".proto")
            for suffix in ("_pb2.py", "_pb2.pyi"):
                generated = (Path(tmp) / f"{stem}{suffix}").read_bytes()
                out[f"{stem}{suffix}"] = _with_header(generated, header)
    return out


def generate(out_dir: Path = OUT_DIR, proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Write the generated package into out_dir; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in sorted(render(proto_dir).items()):
        path = out_dir / name
        path.write_bytes(content)
        written.append(path)
    return written


def drift(out_dir: Path = OUT_DIR, proto_dir: Path = PROTO_DIR) -> list[str]:
    """Names of the files in out_dir that differ from (or are missing versus) a fresh render."""
    stale = []
    for name, content in sorted(render(proto_dir).items()):
        path = out_dir / name
        if not path.is_file() or path.read_bytes() != content:
            stale.append(name)
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cursorsync_devtools.protogen", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output package directory")
    parser.add_argument("--proto-dir", type=Path, default=PROTO_DIR, help="where the .proto are")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the generated files are out of date"
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = drift(args.out, args.proto_dir)
            if stale:
                print(
                    f"out of date in {args.out}: {', '.join(stale)}; "
                    "run python -m cursorsync_devtools.protogen",
                    file=sys.stderr,
                )
                return 1
            print(f"{args.out} is up to date")
            return 0
        for path in generate(args.out, args.proto_dir):
            print(f"wrote {path}")
    except ProtoGenError as exc:
        print(f"protogen: {exc}", file=sys.stderr)
        return 2
    return 0


def _header(source: str, tool: str) -> bytes:
    return (
        f"# Generated by `python -m cursorsync_devtools.protogen` from {source}\n"
        f"# with {tool}. DO NOT EDIT: edit the .proto and regenerate.\n"
    ).encode()


def _with_header(generated: bytes, header: bytes) -> bytes:
    """Our header first, except after a coding line (which must stay on line 1)."""
    first, sep, rest = generated.partition(b"\n")
    if first.startswith(b"# -*- coding"):
        return first + sep + header + rest
    return header + generated


def _protoc(args: list[str], *, cwd: Path) -> str:
    try:
        result = subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", *args],
            cwd=cwd, capture_output=True, text=True, check=False, timeout=120,
        )
    except FileNotFoundError as exc:  # cwd missing
        raise ProtoGenError(f"cannot run protoc in {cwd}: {exc}") from exc
    if result.returncode != 0:
        raise ProtoGenError(
            f"protoc {' '.join(args)} failed (exit {result.returncode}): "
            f"{(result.stderr or result.stdout).strip()}"
        )
    return result.stdout


if __name__ == "__main__":
    raise SystemExit(main())
