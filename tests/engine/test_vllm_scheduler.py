"""Narrative tests of one rank's vLLM scheduler: admission, chunks, preemption, timestamps."""

from __future__ import annotations

import pytest

from servesim.config import EngineConfig
from servesim.engine.kv.block_pool import KvEvent, KvStored
from servesim.engine.request import EngineRequest, Status
from servesim.engine.timing import PolynomialTiming, pass_duration
from servesim.engine.vllm import VllmScheduler
from servesim.workload.request import BlockContentCache, TracePrompt


def make_scheduler(events: list[KvEvent] | None = None, **overrides: object) -> VllmScheduler:
    config = EngineConfig(**{"block_size": 4, "num_gpu_blocks": 64, **overrides})  # type: ignore[arg-type]
    timing = PolynomialTiming(
        config.total_kv_tokens, config.speedup_ratio, config.decode_speedup_ratio
    )
    return VllmScheduler(config, timing, events=events)


_CACHE = BlockContentCache()


def make_request(uid: int, tokens: list[int], length: int, max_output: int) -> EngineRequest:
    """A request whose prompt repeats token ``tokens[i]`` for 4 positions (trace block size 4)."""
    return EngineRequest(uid, TracePrompt(tuple(tokens), 4, length, _CACHE), max_output)


def pre(config_total: int, tokens: int) -> float:
    return PolynomialTiming(config_total, 1.0, 1.0).prefill_ms(1, tokens, 0)


def dec(config_total: int, context: int) -> float:
    return PolynomialTiming(config_total, 1.0, 1.0).decode_ms(1, context, context)


def test_single_request_token_timestamps() -> None:
    """First token at prefill end (no decode time), then one decode pass per token on the logical context."""
    s = make_scheduler()
    total = 64 * 4
    s.submit(make_request(0, [1, 2, 3], 10, 3))
    now, stamps = 0.0, []
    while s.has_work():
        result = s.execute_pass(now)
        now = result.end_ms
        stamps += [now] * len(result.emitted)
    first = pass_duration(pre(total, 10))
    second = first + pass_duration(dec(total, 11))
    third = second + pass_duration(dec(total, 12))
    assert stamps == [first, second, third]


def test_chunked_prefill_splits_the_prompt_by_the_token_budget() -> None:
    """A 20-token prompt under an 8-token budget computes 8, 8, then 4 tokens; the token comes with the last chunk."""
    s = make_scheduler(max_num_batched_tokens=8)
    request = make_request(0, [1, 2, 3, 4, 5], 20, 2)
    s.submit(request)
    computed, emitted = [], []
    now = 0.0
    for _ in range(3):
        result = s.execute_pass(now)
        now = result.end_ms
        computed.append(request.num_computed)
        emitted.append(len(result.emitted))
    assert computed == [8, 16, 20]
    assert emitted == [0, 0, 1]


def test_prefix_hit_reuses_all_but_the_last_block_of_a_cached_prompt() -> None:
    """The recompute rule: an identical block-aligned prompt reuses floor((len - 1) / bs) * bs tokens."""
    s = make_scheduler()
    s.submit(make_request(0, [1, 2, 3, 4], 16, 1))
    s.execute_pass(0.0)
    assert not s.has_work()
    s.submit(make_request(1, [1, 2, 3, 4], 16, 1))
    result = s.execute_pass(100.0)
    assert [(r.uid, reused) for r, reused in result.admitted] == [(1, 12)]


def test_shared_first_block_only() -> None:
    """A prompt that shares only its first trace block reuses exactly that block."""
    s = make_scheduler()
    s.submit(make_request(0, [1, 2, 3], 12, 1))
    s.execute_pass(0.0)
    s.submit(make_request(1, [1, 9, 9], 12, 1))
    result = s.execute_pass(100.0)
    assert [reused for _, reused in result.admitted] == [4]


def test_stored_events_follow_scheduling() -> None:
    """Blocks become cache-visible (Stored) as soon as their tokens are scheduled."""
    events: list[KvEvent] = []
    s = make_scheduler(events, max_num_batched_tokens=8)
    request = make_request(0, [1, 2, 3], 10, 1)
    s.submit(request)
    s.execute_pass(0.0)
    h = request.hashes
    assert events == [KvStored(None, (h[0], h[1]))]


@pytest.mark.parametrize(("mode", "victim"), [("lifo", 1), ("fifo", 0)])
def test_preemption_picks_the_newest_or_the_oldest_running_request(mode: str, victim: int) -> None:
    """When decode growth runs out of blocks, LIFO preempts the newest and FIFO the oldest; it waits at the front."""
    s = make_scheduler(num_gpu_blocks=5, preemption_mode=mode)
    a = make_request(0, [1, 2], 8, 10)
    b = make_request(1, [3, 4], 8, 10)
    s.submit(a)
    s.submit(b)
    now = 0.0
    preempted: list[int] = []
    while not preempted:
        result = s.execute_pass(now)
        now = result.end_ms
        preempted = [r.uid for r in result.preempted]
        s.pool.check([r.blocks for r in (*s.running, *s.waiting)])
    assert preempted == [victim]
    assert s.waiting[0].uid == victim
    assert s.waiting[0].status is Status.PREEMPTED


def test_prompt_that_can_never_fit_is_rejected() -> None:
    """A fresh prompt needing more blocks than the rank has is rejected, not left waiting."""
    s = make_scheduler(num_gpu_blocks=2)
    s.submit(make_request(0, [1, 2, 3], 12, 1))
    result = s.execute_pass(0.0)
    assert [r.uid for r in result.rejected] == [0]
    assert not s.has_work()


def test_waiting_head_blocks_the_queue_when_the_sequence_does_not_fit() -> None:
    """A head whose whole sequence does not fit blocks the requests behind it, even ones that would fit."""
    s = make_scheduler(num_gpu_blocks=6)
    s.submit(make_request(0, [1, 2, 3, 4, 5], 20, 5))  # 5 blocks
    s.submit(make_request(1, [6, 7], 8, 1))  # needs 2 blocks: only 1 left
    s.submit(make_request(2, [8], 3, 1))  # needs 1 block, but waits behind the head
    result = s.execute_pass(0.0)
    assert [r.uid for r, _ in result.admitted] == [0]
    assert [r.uid for r in s.waiting] == [1, 2]
