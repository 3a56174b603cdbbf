"""A long prompt's middle chunks run as one fast-forward window, with the same times as stepping.

With ``max_num_batched_tokens`` 256 and block size 64, request B (3,000
prompt tokens, arriving at 5 ms) is admitted beside A, which decodes: each
pass gives A one token and B the 255 the budget leaves. B's first chunk
(its admission) and last chunk (its first token) are stepped passes; the
ten in between are one window, each pass ending at (start + prefill part) +
decode part, as the reference's clock advances. Request C arrives during
that window, cuts it, and waits for budget. The token times are the
reference's (``refcheck.py reference``), to the bit, in both modes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servesim import RunConfig, parse_engine_args, run
from servesim.engine import vllm
from tests.support import write_trace

ENGINE = {"block_size": 64, "max_num_batched_tokens": 256}
B_PROMPT = (5.0, 3000, 4, [2, 3, 4, 5, 6, 7])


def _windows(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Record every chunk window planned: (passes, members, chunk)."""
    planned: list[tuple[int, int, int]] = []
    plan_chunks = vllm.VllmScheduler._plan_chunks

    def recording(self: vllm.VllmScheduler, limit: int) -> Any:
        plan = plan_chunks(self, limit)
        if plan is not None:
            planned.append((len(plan.durations), plan.members, plan.chunk))
        return plan

    monkeypatch.setattr(vllm.VllmScheduler, "_plan_chunks", recording)
    return planned


def _replay(trace: Path, exact_passes: bool, **engine: Any) -> Any:
    return run(
        RunConfig(
            trace=trace,
            trace_block_size=512,
            engine=parse_engine_args({**ENGINE, **engine}),
            exact_passes=exact_passes,
        )
    )


@pytest.mark.parametrize("exact_passes", [False, True], ids=["fast_forward", "exact"])
def test_middle_chunks_beside_a_decoder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exact_passes: bool
) -> None:
    """A decodes 40 tokens; B's ten middle chunks are one window (C cuts it at 150 ms)."""
    trace = write_trace(
        tmp_path / "trace.jsonl",
        [(0.0, 100, 40, [1]), B_PROMPT, (150.0, 200, 3, [8])],
    )
    windows = _windows(monkeypatch)
    a, b, c = _replay(trace, exact_passes).records
    assert windows == ([] if exact_passes else [(10, 1, 255)])
    assert (a.first_token_ms, a.last_token_ms) == (18.023974000000003, 506.0665460000002)
    assert (b.first_admit_ms, b.first_token_ms, b.last_token_ms) == (
        18.023974000000003,
        331.79207400000007,
        368.1489380000001,
    )
    assert (c.first_token_ms, c.last_token_ms) == (356.3275960000001, 368.1489380000001)


@pytest.mark.parametrize("exact_passes", [False, True], ids=["fast_forward", "exact"])
def test_a_window_ends_with_a_members_last_token_and_runs_without_members(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exact_passes: bool
) -> None:
    """A (12 tokens) finishes in the last pass of B's window; later C's prompt (2,000
    tokens), alone, has six middle chunks of the whole budget as a window of its own."""
    trace = write_trace(
        tmp_path / "trace.jsonl",
        [(0.0, 100, 12, [1]), B_PROMPT, (400.0, 2000, 2, [9, 10, 11, 12])],
    )
    windows = _windows(monkeypatch)
    a, b, c = _replay(trace, exact_passes).records
    assert windows == ([] if exact_passes else [(10, 1, 255), (6, 0, 256)])
    assert (a.first_token_ms, a.last_token_ms) == (18.023974000000003, 305.63033400000006)
    assert (b.first_token_ms, b.last_token_ms) == (325.1085330000001, 342.79178100000007)
    assert (c.first_admit_ms, c.first_token_ms, c.last_token_ms) == (
        400.0,
        562.589587,
        568.4325610000001,
    )


def test_a_window_stops_where_the_pool_would_run_dry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four decoders (block size 4: a new block every fourth token) and a 1,000-token prompt
    in 360 blocks: the prompt's window stops after 15 of its 16 middle chunks, as the
    members' new blocks would leave its 16th none; later the pool preempts (the records
    are the reference's, and stepping's)."""
    trace = write_trace(
        tmp_path / "trace.jsonl",
        [*[(0.0, 100, 300, [k]) for k in (1, 2, 3, 4)], (30.0, 1000, 4, [12, 13])],
    )
    engine = {"block_size": 4, "max_num_batched_tokens": 64, "num_gpu_blocks": 360}
    windows = _windows(monkeypatch)
    fast = _replay(trace, False, **engine).records
    assert windows[0] == (15, 4, 60)
    assert [vars_of(r) for r in fast] == [
        vars_of(r) for r in _replay(trace, True, **engine).records
    ]
    prompt = fast[-1]
    assert (prompt.first_admit_ms, prompt.first_token_ms, prompt.last_token_ms) == (
        152.555556,
        9677.793768000005,
        9779.353728000006,
    )


@pytest.mark.parametrize("cap", [40.0, 100.0, 180.0, 331.79207400000007])
def test_a_time_cap_inside_a_window_counts_the_chunk_in_flight(tmp_path: Path, cap: float) -> None:
    """Stopped inside B's window, the prompt tokens computed so far (the pass in flight's
    chunk included, as stepping schedules it at its start) and the records match stepping."""
    trace = write_trace(tmp_path / "trace.jsonl", [(0.0, 100, 40, [1]), B_PROMPT])
    reports = [
        run(
            RunConfig(
                trace=trace,
                trace_block_size=512,
                engine=parse_engine_args(ENGINE),
                max_sim_time_ms=cap,
                exact_passes=exact,
            )
        )
        for exact in (False, True)
    ]
    fast, exact = (r.summary["committed_prefill_tokens"] for r in reports)
    assert fast == exact
    assert [vars_of(r) for r in reports[0].records] == [vars_of(r) for r in reports[1].records]


def vars_of(record: Any) -> dict[str, Any]:
    """A record's fields, for comparing records of two runs."""
    return {name: getattr(record, name) for name in type(record).__slots__}
