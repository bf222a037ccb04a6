"""Where the checkout is, for tests that read its files (conf/, helm/, docs/, pyproject)."""

from __future__ import annotations

from pathlib import Path

#: The checkout's root (this file is tests/support/paths.py).
ROOT = Path(__file__).resolve().parents[2]
