"""Windows through members' finishes are priced once per shape and reused.

A periodic open loop on one worker (each arrival cuts the window; members
leave one by one) plans windows of the same shape again and again: the rank
prices each shape once (``VllmScheduler._price_stretches``) and every
request's record is still what stepping every pass gives.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

from servesim.engine.vllm import VllmScheduler
from tests.support import replay_synthetic


def replay(*, exact_passes: bool) -> list[Any]:
    report = replay_synthetic(
        64, 48, 60, {"block_size": 16}, arrival_interval_ms=40.0, exact_passes=exact_passes
    )
    return report.records


def test_periodic_windows_reuse_their_priced_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter[str] = Counter()
    plan, price = VllmScheduler._plan_through_finishes, VllmScheduler._price_stretches

    def counted_plan(self: VllmScheduler, passes: int) -> Any:
        calls["plans"] += 1
        return plan(self, passes)

    def counted_price(self: VllmScheduler, passes: int, leaving: Any) -> Any:
        calls["priced"] += 1
        return price(self, passes, leaving)

    monkeypatch.setattr(VllmScheduler, "_plan_through_finishes", counted_plan)
    monkeypatch.setattr(VllmScheduler, "_price_stretches", counted_price)
    fast = replay(exact_passes=False)
    # 59 windows through finishes, of 25 shapes (counted on this run): the others
    # reuse what an earlier window of their shape priced.
    assert calls == {"plans": 59, "priced": 25}
    exact = replay(exact_passes=True)
    assert len(fast) == len(exact) == 60
    for f, e in zip(fast, exact, strict=True):
        for name in ("first_token_ms", "second_token_ms", "last_token_ms", "first_admit_ms"):
            # Window ends are sums of durations, the passes' a running total.
            assert math.isclose(getattr(f, name), getattr(e, name), rel_tol=1e-12), name
        assert f.output_length == e.output_length == 48
