"""Output that must be JSON on every line (``logging.json``), read back for the tests."""

from __future__ import annotations

import json
from typing import Any

import pytest


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every non-empty line of ``text`` as a JSON object (fails on any other line)."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}\nin:\n{text}")
        assert isinstance(value, dict), line
        out.append(value)
    return out
