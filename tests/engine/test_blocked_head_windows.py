"""Decode windows while the waiting queue's head cannot be admitted.

A KV cache too small for the load keeps requests waiting. Decode-only passes
only take blocks, so a head that does not fit now fails its admission check
at every pass until a running request ends: those passes are planned as a
window (ending at the first member's last token, even where windows may
otherwise run through finishes), and every request's record is what
stepping every pass gives.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from servesim import RunConfig, run
from servesim.config import parse_engine_args
from servesim.engine.scheduler import DecodePlan
from servesim.engine.vllm import VllmScheduler
from tests.support import replay_synthetic, write_trace

# Room for four requests' 100 + 40 tokens (nine blocks each) in 40 blocks of 16 tokens.
SMALL_KV = {"block_size": 16, "num_gpu_blocks": 40}
# Room for all of them, but three running at most.
THREE_SEQS = {"block_size": 16, "max_num_seqs": 3}


def replay(engine: dict[str, Any], *, exact_passes: bool, **arrivals: Any) -> list[Any]:
    arrivals.setdefault("arrival_interval_ms", None)  # (a closed loop paces itself)
    return replay_synthetic(100, 40, 30, engine, exact_passes=exact_passes, **arrivals).records


def replay_trace(trace: Path, engine: dict[str, Any], *, exact_passes: bool) -> list[Any]:
    """The records of a Mooncake trace (16-token trace blocks) replayed on one worker."""
    config = RunConfig(
        trace=str(trace),
        trace_block_size=16,
        engine=parse_engine_args(engine),
        exact_passes=exact_passes,
    )
    return run(config).records


def assert_same_records(fast: list[Any], exact: list[Any]) -> None:
    assert len(fast) == len(exact) > 0
    for f, e in zip(fast, exact, strict=True):
        for name in ("first_admit_ms", "first_token_ms", "second_token_ms", "last_token_ms"):
            # Window ends are sums of durations, the passes' a running total.
            assert math.isclose(getattr(f, name), getattr(e, name), rel_tol=0, abs_tol=1e-9), name
        assert (f.output_length, f.terminal_status) == (e.output_length, e.terminal_status)


def count_windows(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count the windows vLLM ranks plan from now on, and those planned while requests wait."""
    planned: Counter[str] = Counter()
    plan_decode = VllmScheduler.plan_decode

    def counted(self: VllmScheduler, limit: int) -> DecodePlan | None:
        plan = plan_decode(self, limit)
        if plan is not None:
            planned["windows"] += 1
            if self.waiting:
                planned["while waiting"] += 1
                assert not plan.stretches, "a window with a waiting head ends at a finish"
        return plan

    monkeypatch.setattr(VllmScheduler, "plan_decode", counted)
    return planned


@pytest.mark.parametrize(
    ("engine", "arrivals", "expected"),
    [
        # A closed loop of 12: eight wait while four run.
        (SMALL_KV, {"replay_concurrency": 12}, {"windows": 23, "while waiting": 21}),
        # An open loop that outruns the worker (one request every 5 ms), where windows
        # would run through members' finishes but for the waiting head.
        (SMALL_KV, {"arrival_interval_ms": 5.0}, {"windows": 23, "while waiting": 22}),
        # The running slots are full: the head would fit but waits for one.
        (THREE_SEQS, {"replay_concurrency": 12}, {"windows": 10, "while waiting": 9}),
    ],
)
def test_a_blocked_head_waits_through_windows(
    monkeypatch: pytest.MonkeyPatch,
    engine: dict[str, Any],
    arrivals: dict[str, Any],
    expected: dict[str, int],
) -> None:
    planned = count_windows(monkeypatch)
    fast = replay(engine, exact_passes=False, **dict(arrivals))
    assert planned == expected  # (counted on these runs: most windows form while others wait)
    exact = replay(engine, exact_passes=True, **dict(arrivals))
    assert len(fast) == 30
    assert_same_records(fast, exact)


def test_a_head_that_fits_by_the_prefix_others_hold_is_admitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """24 requests at once that share five of their six prompt blocks, in 20 blocks: a head
    needing more blocks than are free may fit by the shared blocks running requests hold
    (its admission counts them once), and is admitted in the pass stepping admits it."""
    trace = write_trace(
        tmp_path / "shared.jsonl", [(0.0, 96, 40, [1, 2, 3, 4, 5, 100 + i]) for i in range(24)]
    )

    engine = {"block_size": 16, "num_gpu_blocks": 20}
    planned = count_windows(monkeypatch)
    fast = replay_trace(trace, engine, exact_passes=False)
    assert planned == {"windows": 20, "while waiting": 18}  # (counted on this run)
    exact = replay_trace(trace, engine, exact_passes=True)
    assert len(fast) == 24 and sum(r.reused_input_tokens for r in fast) == 1984
    assert_same_records(fast, exact)


def test_a_blocked_head_waits_through_windows_beside_a_host_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host KV tier under the same small GPU cache: two groups of twelve requests sharing
    a prefix arrive at once, then the first group's prefix comes back after the second
    evicted it from the GPU, and is loaded from host. While no copy is under way and the
    waiting head's lookup would only touch its host blocks as they already are, its
    passes are planned as windows; every record, with the tokens reused from host, is
    what stepping gives."""
    rows = [(0.0, 96, 40, [1, 2, 3, 4, 5, 100 + i]) for i in range(12)]
    rows += [(0.0, 96, 40, [6, 7, 8, 9, 10, 200 + i]) for i in range(12)]
    rows += [(4000.0, 96, 40, [1, 2, 3, 4, 5, 300 + i]) for i in range(12)]
    trace = write_trace(tmp_path / "returning.jsonl", rows)
    engine = {
        "block_size": 16,
        "num_gpu_blocks": 20,
        "kv_cache_bytes_per_token": 1_000_000,  # (16 MB a block: copies take a while)
        "native_host_offload": {"num_host_blocks": 60},
    }

    planned = count_windows(monkeypatch)
    fast = replay_trace(trace, engine, exact_passes=False)
    assert planned == {"windows": 31, "while waiting": 26}  # (counted on this run)
    exact = replay_trace(trace, engine, exact_passes=True)
    host = [r.first_admission_host_reused_input_tokens for r in fast]
    assert host == [r.first_admission_host_reused_input_tokens for r in exact]
    assert sum(host) == 80  # (the first returning request loads its five shared blocks)
    assert_same_records(fast, exact)
