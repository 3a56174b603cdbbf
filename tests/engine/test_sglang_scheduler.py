"""Narrative tests of the SGLang scheduler: pass kinds, chunking, retraction and its victim."""

from __future__ import annotations

import pytest

from servesim import RunConfig, SyntheticWorkload, parse_engine_args, run
from servesim.engine.request import EngineRequest, Status
from servesim.engine.sglang import SglangScheduler
from servesim.engine.timing import make_timing
from servesim.workload.request import SyntheticPrompt


def _scheduler(**keys: object) -> SglangScheduler:
    config = parse_engine_args({"backend": "sglang", **keys})
    return SglangScheduler(config, make_timing(config))


def _request(uid: int, prompt: int, output: int) -> EngineRequest:
    return EngineRequest(uid, SyntheticPrompt(uid, prompt), output)


def test_a_prefill_pass_emits_first_tokens_at_no_decode_cost_and_stalls_decoding() -> None:
    """Two 2,000-token prompts, 15 ms apart, on one worker (block 16): the reference's times.

    Pass 1 prefills A alone: A's first token at prefill(1 x 2,000) = 48.552296 ms, no
    decode step charged. B arrived during it, so pass 2 prefills B: B's first token at
    97.104592, and A, already running, gets nothing. Then four decode passes step both.
    """
    config = RunConfig(
        synthetic=SyntheticWorkload(
            input_tokens=2000, output_tokens=5, request_count=2, arrival_interval_ms=15
        ),
        engine=parse_engine_args({"backend": "sglang", "block_size": 16}),
    )
    a, b = run(config).records
    assert a.first_token_ms == pytest.approx(48.552296, rel=1e-12)
    assert b.first_token_ms == pytest.approx(97.104592, rel=1e-12)
    assert a.last_token_ms == b.last_token_ms == pytest.approx(123.341188, rel=1e-12)


def test_a_prompt_is_chunked_to_what_is_left_of_the_chunk_budget() -> None:
    """With 512-token chunks, a 400-token prompt takes 400; the next one gets the 112 left
    (whole pages: 7 x 16) and returns to the front of waiting with those pages cached."""
    scheduler = _scheduler(block_size=16, sglang={"chunked_prefill_size": 512})
    first, second = _request(0, 400, 4), _request(1, 400, 4)
    scheduler.submit(first)
    scheduler.submit(second)
    result = scheduler.execute_pass(0.0)
    assert [r.uid for r, _ in result.admitted] == [0, 1]
    # The first token has its KV slot at once (401 tokens); the chunk stops at 112.
    assert first.num_computed == 401 and second.num_computed == 112
    assert first.status is Status.RUNNING and second.status is Status.WAITING
    assert list(scheduler.waiting) == [second] and scheduler.running == [first]
    assert second.lease is not None and second.lease.cached_tokens == 112
    assert result.emitted == [first]  # only a completed prefill gets its first token
    # The continuation is not an admission, and it computes the other 288 tokens.
    result = scheduler.execute_pass(result.end_ms)
    assert result.admitted == [] and second.num_computed == 401
    assert result.emitted == [second] and first.generated == 1  # the running request waits


def test_a_decode_pass_retracts_the_request_with_the_fewest_output_tokens() -> None:
    """Ten pages of 4 tokens. Two requests decode, a third joins two passes later; when
    their next tokens need more pages than are free or evictable, the latecomer (fewest
    outputs) is retracted: its pages go back, it joins the back of waiting with its
    outputs kept, and ``new_token_ratio`` is re-estimated from the two that stay."""
    scheduler = _scheduler(block_size=4, num_gpu_blocks=10, sglang={"clip_max_new_tokens": 1})
    early, late = [_request(0, 6, 30), _request(1, 6, 30)], _request(2, 6, 30)
    for request in early:
        scheduler.submit(request)
    now, passes = 0.0, 0
    retracted: list[EngineRequest] = []
    while not retracted:
        if passes == 2:
            scheduler.submit(late)
        result = scheduler.execute_pass(now)
        retracted, now, passes = result.preempted, result.end_ms, passes + 1
        scheduler.check()
    assert retracted == [late] and late.status is Status.PREEMPTED and late.num_computed == 0
    assert 0 < late.generated < early[0].generated - 1  # its outputs are kept
    assert scheduler.running == early and list(scheduler.waiting) == [late]
    decoded = sum(r.generated - 1 for r in early)  # before this pass's token
    assert scheduler.new_token_ratio == min(1.0, (decoded + 20 * 2) / (2 * 30 + 1))


def test_the_new_token_ratio_decays_on_decode_passes_only() -> None:
    scheduler = _scheduler(block_size=16)
    scheduler.submit(_request(0, 100, 5))
    init = scheduler.new_token_ratio
    assert init == pytest.approx(0.7)
    result = scheduler.execute_pass(0.0)  # a prefill pass
    assert scheduler.new_token_ratio == init
    scheduler.execute_pass(result.end_ms)  # a decode pass
    assert scheduler.new_token_ratio == pytest.approx(init - (0.7 - 0.098) / 600, rel=1e-15)
