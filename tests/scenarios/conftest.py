"""The session's shared servesim runs (see ``runs.py``)."""

from __future__ import annotations

import pytest

from tests.scenarios.runs import ServesimRuns


@pytest.fixture(scope="session")
def servesim_runs(tmp_path_factory: pytest.TempPathFactory) -> ServesimRuns:
    """The session's cache of servesim runs."""
    return ServesimRuns(tmp_path_factory.mktemp("servesim-runs"))
