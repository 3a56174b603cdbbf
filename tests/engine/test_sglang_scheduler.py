"""Narrative tests of the SGLang scheduler: pass kinds, chunking, retraction and its victim."""

from __future__ import annotations

import pytest

from servesim import RunConfig, SyntheticWorkload, parse_engine_args, run
from servesim.engine.request import EngineRequest, Status
from servesim.engine.sglang import SglangScheduler
from servesim.engine.timing import make_timing
from servesim.engine.worker import Worker
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


def _stuck_worker(head_prompt: int) -> tuple[Worker, SglangScheduler, EngineRequest]:
    """One rank of 9 one-token pages, speculative bursts of 5 (nextn 4), each running
    request's reserve clipped to 3 tokens, fixed timing (prefill 5 ms). R (4-token prompt,
    20 outputs) is prefilled by 5 ms: its 5 pages leave 4 free, too few for its next burst
    of 5, so its decode passes do nothing from then on (a lone request is not retracted).
    A request of ``head_prompt`` tokens and 1 output waits behind it from 5 ms."""
    config = parse_engine_args(
        {
            "backend": "sglang",
            "block_size": 1,
            "num_gpu_blocks": 9,
            "aic_nextn": 4,
            "aic_nextn_accept_rates": "1,1,1,1",
            "sglang": {"clip_max_new_tokens": 3},
            "timing_model": {"type": "fixed", "prefill_ms": 5.0, "decode_ms": 1.0},
        }
    )
    worker = Worker(0, config)
    (rank,) = worker.ranks
    assert isinstance(rank, SglangScheduler)
    stuck, head = _request(0, 4, 20), _request(1, head_prompt, 1)
    worker.submit(0, stuck, 0.0)
    assert worker.start_pass(0.0) == (5.0, [(stuck, 0)])
    worker.finish_pass()
    assert stuck.generated == 1 and rank.kv.available_tokens == 4
    worker.submit(0, head, 5.0)
    return worker, rank, head


def _ratio_after(passes: int) -> float:
    """``new_token_ratio`` after ``passes`` decode passes from its start (0.7, floor 0.098)."""
    ratio, floor = 0.7, 0.7 * 0.14
    for _ in range(passes):
        ratio = max(ratio - (0.7 - floor) / 600, floor)
    return ratio


def test_a_pass_that_does_nothing_is_run_again_at_once_while_it_lowers_the_ratio() -> None:
    """The reference's ``same_timestamp_retry``: a zero-duration pass that did nothing is
    run again at the same instant as long as that changes ``new_token_ratio``.

    At 5 ms the 1-token head needs 2 tokens of the budget (its page and its 1-token
    output reserve) out of the 4 free less R's reserve, 3 x the ratio: 4 - 2.1 at 0.7,
    too little. R's burst does not fit either, so the pass does nothing but decay the
    ratio one step. Each run again decays it one more step; the one run with the ratio
    34 steps down (the 35th pass at 5 ms) is the first whose ratio is below 2/3: it
    admits the head, whose prefill pass ends at 10 ms with its only token. The 33 passes
    between (33 steps down at most) would decide nothing and are not run: the ratio
    takes their steps at once.
    """
    worker, rank, head = _stuck_worker(1)
    assert _ratio_after(33) >= 2 / 3 > _ratio_after(34)
    assert worker.start_pass(5.0) == (10.0, [(head, 0)])
    assert rank.new_token_ratio == _ratio_after(34)  # a prefill pass does not decay it
    assert worker.finish_pass().finished == [head]


def test_a_pass_that_does_nothing_takes_the_ratio_to_its_floor_when_no_repeat_admits() -> None:
    """As above with a 3-token head: it needs 4 tokens, never below 4 less R's reserve,
    however low the ratio goes (to 0.098). The passes run again at 5 ms all do nothing,
    and the last of them leaves the ratio at its floor: the worker stalls until a request
    arrives."""
    worker, rank, _ = _stuck_worker(3)
    assert worker.start_pass(5.0) is None and worker.stalled
    assert rank.new_token_ratio == _ratio_after(600) == 0.7 * 0.14
