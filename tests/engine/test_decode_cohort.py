"""Narrative tests of the decode cohort: members advance with the rank's pass counter.

One request, a 6-token prompt, block size 4, 6 output tokens. Pass 1 computes
the prompt (blocks 0 and 1) and emits token 1; the request then joins the
cohort. Pass p >= 2 computes sequence position p + 4: position 7 fills block
1 (pass 3), position 8 needs block 2 (pass 4), position 11 fills it (pass 7,
never reached: token 6 comes in pass 6 and ends the request).
"""

from __future__ import annotations

from servesim.config import EngineConfig
from servesim.engine.request import EngineRequest, Status
from servesim.engine.timing import PolynomialTiming
from servesim.engine.vllm import VllmScheduler
from servesim.workload.request import BlockContentCache, TracePrompt


def make_scheduler(*, lazy: bool) -> VllmScheduler:
    config = EngineConfig(block_size=4, num_gpu_blocks=16)
    timing = PolynomialTiming(
        config.total_kv_tokens, config.speedup_ratio, config.decode_speedup_ratio
    )
    return VllmScheduler(config, timing, lazy=lazy)


def make_request() -> EngineRequest:
    return EngineRequest(0, TracePrompt((7, 8), 4, 6, BlockContentCache()), 6, shared_blocks=2)


def run(*, lazy: bool) -> list[tuple[float, int, int, int, int]]:
    """Per pass: end, tokens emitted (listed or counted), blocks held, free blocks."""
    s = make_scheduler(lazy=lazy)
    request = make_request()
    s.submit(request)
    now, out = 0.0, []
    while s.has_work():
        result = s.execute_pass(now)
        now = result.end_ms
        s.last_emit_ms = now  # what the worker does when the pass ends
        out.append(
            (
                now,
                len(result.emitted),
                sum(count for _, count in result.cohorts),
                len(request.blocks),
                s.pool.num_free,
            )
        )
    return out


def test_a_member_emits_as_a_count_and_gets_its_block_in_the_right_pass() -> None:
    """The cohort gives the same pass ends and block timeline as stepping; its tokens are counted."""
    lazy, exact = run(lazy=True), run(lazy=False)
    assert [(end, blocks, free) for end, _, _, blocks, free in lazy] == [
        (end, blocks, free) for end, _, _, blocks, free in exact
    ]
    # Pass 1 emits the first token (listed); passes 2-5 count it as a member;
    # pass 6 lists its last token again: it left the cohort to finish.
    assert [(listed, counted) for _, listed, counted, _, _ in lazy] == [
        (1, 0),
        (0, 1),
        (0, 1),
        (0, 1),
        (0, 1),
        (1, 0),
    ]
    assert [blocks for _, _, _, blocks, _ in lazy] == [2, 2, 2, 3, 3, 0]


def test_leaving_the_cohort_materialises_progress_and_reports_a_catch_up() -> None:
    """A member that leaves has the length stepping gives it, and reports its member tokens."""
    s = make_scheduler(lazy=True)
    request = make_request()
    s.submit(request)
    now = 0.0
    for _ in range(4):  # pass 1 (prefill), then 3 member passes
        now = s.execute_pass(now).end_ms
        s.last_emit_ms = now
    assert request.generated == 1  # stale while it is a member
    s.flush_cohort(s.passes, now)
    assert (request.generated, request.num_computed, request.length) == (4, 9, 10)
    assert request.status is Status.RUNNING
    assert s.take_catch_ups() == [(request, 3, now)]
