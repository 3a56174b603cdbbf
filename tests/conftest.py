"""Shared fixtures and paths."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture
def shared_dir() -> Path:
    """The team's shared folder (traces, profiles); CI has it beside the clone."""
    if not SHARED.is_dir():
        pytest.skip("../shared is not available")
    return SHARED
