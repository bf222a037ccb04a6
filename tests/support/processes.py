"""Processes and modules a test runs or fakes: a command outside the checkout, a stand-in
module in sys.modules."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest


def run_outside(args: list[str], cwd: Path, timeout: float = 120
                ) -> subprocess.CompletedProcess[str]:
    """A command with no PYTHONPATH (nothing from the checkout) and no CURSORSYNC_CONFIG."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CURSORSYNC_CONFIG")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def fake_module(monkeypatch: pytest.MonkeyPatch, name: str, attr: str,
                fn: Any) -> list[dict[str, Any]]:
    """Install ``name`` in sys.modules with ``attr`` recording its calls; returns the calls."""
    calls: list[dict[str, Any]] = []

    def record(*args: Any, **kwargs: Any) -> Any:
        calls.append({"args": args, **kwargs})
        return fn(*args, **kwargs)

    module = types.ModuleType(name)
    setattr(module, attr, record)
    monkeypatch.setitem(sys.modules, name, module)
    return calls
