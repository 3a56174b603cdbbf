"""Decode fast-forward gives the same per-request records as stepping every pass.

Runs every reference scenario servesim supports in both modes and compares
each request's record field by field: times within 1e-9 ms, everything else
equal.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from servesim.cli import main
from tests.scenarios.test_reference_scenarios import scenario_argv

SCENARIOS = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "scenarios"
UNSUPPORTED = ("sglang", "trtllm")


def supported(path: Path) -> bool:
    text = path.read_text()
    return not any(word in text for word in UNSUPPORTED)


def records(argv: list[str], out: Path) -> list[dict[str, Any]]:
    assert main([*argv, "--per-request-jsonl", str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def assert_same(fast: dict[str, Any], exact: dict[str, Any]) -> None:
    assert fast.keys() == exact.keys()
    for key, value in exact.items():
        other = fast[key]
        if isinstance(value, float) and isinstance(other, float):
            assert math.isclose(other, value, rel_tol=0, abs_tol=1e-9), (key, other, value)
        else:
            assert other == value, (key, other, value)


@pytest.mark.parametrize(
    "path", sorted(p for p in SCENARIOS.glob("*.json") if supported(p)), ids=lambda p: p.stem
)
def test_fast_forward_matches_exact_passes(path: Path, shared_dir: Path, tmp_path: Path) -> None:
    """Every request's arrival, admission, token times, reuse and status agree in both modes."""
    sc = json.loads(path.read_text())
    if "timing_model" in sc.get("engine", {}):
        timing = sc["engine"]["timing_model"]
        sc["engine"]["timing_model"] = {
            "type": "interpolated",
            "path": str(shared_dir / timing["config"]["path"]),
        }
    argv = scenario_argv(sc, shared_dir, tmp_path, tmp_path / "report.json")
    fast = records(argv, tmp_path / "fast.jsonl")
    exact = records([*argv, "--exact-passes"], tmp_path / "exact.jsonl")
    assert len(fast) == len(exact) > 0
    for f, e in zip(fast, exact, strict=True):
        assert_same(f, e)
