"""Decode fast-forward gives the same per-request records as stepping every pass.

Runs every reference scenario in ``tests/scenarios/reference/`` (data from
``tests/data/``) in both modes, servesim's default (decode fast-forward) and
``--exact-passes``, and compares each request's record field by field:
times within 1e-9 ms, everything else equal. The default-mode run is the
one the reference comparisons use (shared through the session's cache).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.scenarios.harness import flatten_all, load_scenarios
from tests.scenarios.runs import ServesimRuns


def assert_same(fast: dict[str, Any], exact: dict[str, Any]) -> None:
    """Two records of one request agree: floats to 1e-9 absolute, other values exactly."""
    assert fast.keys() == exact.keys()
    for key, value in exact.items():
        other = fast[key]
        if isinstance(value, float) and isinstance(other, float):
            assert math.isclose(other, value, rel_tol=0, abs_tol=1e-9), (key, other, value)
        else:
            assert other == value, (key, other, value)


@pytest.mark.parametrize("name", [sc.name for sc in load_scenarios()])
def test_fast_forward_matches_exact_passes(name: str, servesim_runs: ServesimRuns) -> None:
    """Every request's arrival, admission, token times, reuse and status agree in both modes."""
    fast = servesim_runs.get(name).records
    exact = servesim_runs.get(name, exact_passes=True).records
    assert len(fast) == len(exact) > 0
    for f, e in zip(fast, exact, strict=True):
        assert_same(f, e)


@pytest.mark.parametrize("name", [sc.name for sc in load_scenarios() if sc.telemetry])
def test_fast_forward_samples_what_stepping_samples(name: str, servesim_runs: ServesimRuns) -> None:
    """Telemetry samples agree in both modes: windows split at sample times show the stepped state."""
    fast = flatten_all(servesim_runs.get(name).sections["telemetry"])
    exact = flatten_all(servesim_runs.get(name, exact_passes=True).sections["telemetry"])
    assert_same(fast, exact)


@pytest.mark.parametrize("name", [sc.name for sc in load_scenarios() if sc.planner])
def test_fast_forward_plans_what_stepping_plans(name: str, servesim_runs: ServesimRuns) -> None:
    """The planner's scaling events and ticks agree in both modes: windows split at ticks."""
    fast = flatten_all(servesim_runs.get(name).sections["planner"])
    exact = flatten_all(servesim_runs.get(name, exact_passes=True).sections["planner"])
    assert fast.keys() == exact.keys()
    for key, value in exact.items():
        # Variances of FPMs sum the same lengths in another order: 1e-16 apart.
        if isinstance(value, float):
            assert math.isclose(fast[key], value, rel_tol=1e-12, abs_tol=1e-9), key
        else:
            assert fast[key] == value, key
