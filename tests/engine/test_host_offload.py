"""KV offload to host and disk, request by request, as the reference's probes show it.

Every scenario: one worker, 16-token blocks, a fixed 10 ms prefill and 1 ms
decode, and 62,500 KV bytes per token, so one block is 1 MB and takes 1 ms
per GB/s of bandwidth. Requests A = ids 1-4 and C = 5-8 (64 tokens, 2 output
tokens each); B repeats A's prompt. Each expectation was measured on the
reference (Dynamo 1.6.1). The last four tests drive one rank's host side
directly, with 4-token blocks of 1 MB; the reference's behaviour they pin is
measured by the stored scenarios ``agg_offload_store_awaits_write``,
``agg_offload_allocation_awaits_write`` and
``agg_offload_partial_block_awaits_write``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servesim import RunConfig, parse_engine_args, run
from servesim.config import HostOffloadConfig
from servesim.engine.host_offload import HostOffload
from servesim.engine.kv.host_tier import HostTier, Residency
from servesim.engine.request import EngineRequest
from servesim.engine.timing import PolynomialTiming
from servesim.engine.vllm import VllmScheduler
from servesim.errors import ConfigError
from servesim.metrics.collector import RequestRecord
from servesim.workload.request import BlockContentCache, RunPrompt

A, C = [1, 2, 3, 4], [5, 6, 7, 8]


def _replay(
    tmp_path: Path,
    requests: list[tuple[float, list[int]]],
    *,
    gpu_blocks: int = 6,
    host: dict[str, Any] | None = None,
    disk: dict[str, Any] | None = None,
) -> list[RequestRecord]:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 64, "output_length": 2, "hash_ids": ids})
            + "\n"
            for t, ids in requests
        )
    )
    engine: dict[str, Any] = {
        "block_size": 16,
        "num_gpu_blocks": gpu_blocks,
        "kv_cache_bytes_per_token": 62_500,
        "timing_model": {"type": "fixed", "prefill_ms": 10, "decode_ms": 1},
        "native_host_offload": {
            "num_host_blocks": 16,
            "d2h_bandwidth_gbps": 1.0,
            "h2d_bandwidth_gbps": 1.0,
            **(host or {}),
        },
    }
    if disk is not None:
        engine["g3_offload"] = disk
    config = RunConfig(trace=trace, trace_block_size=16, engine=parse_engine_args(engine))
    return run(config).records


def test_a_prompt_evicted_to_host_is_loaded_back_at_the_h2d_bandwidth(tmp_path: Path) -> None:
    """A is stored to host after its prefill; C's prompt evicts A's tail from the GPU (a
    finished request frees its blocks last first). B at 100 finds A's first block on the
    GPU and the other three on host: a 3 MB load, 100 -> 103, then its prefill. Its 48
    reused tokens (the last block is recomputed) are 16 from the GPU and 32 from host."""
    a, c, b = _replay(tmp_path, [(0, A), (50, C), (100, A)])
    assert (a.first_token_ms, c.first_token_ms) == (10.0, 60.0)
    assert b.first_admit_ms == 103.0
    assert (b.first_token_ms, b.last_token_ms) == (113.0, 114.0)
    assert (b.first_admission_reused_input_tokens, b.first_admission_host_reused_input_tokens) == (
        48,
        32,
    )


def test_a_prompt_whole_on_the_gpu_still_computes_its_last_block(tmp_path: Path) -> None:
    """B repeats A after A finished, and all four of A's blocks are still on the GPU: the
    match stops one block short, since the prompt's last token must be computed, so B
    reuses 48 tokens, none from host, and its prefill runs 50 -> 60."""
    _, b = _replay(tmp_path, [(0, A), (50, A)])
    assert (b.first_admit_ms, b.first_token_ms, b.last_token_ms) == (50.0, 60.0, 61.0)
    assert (b.first_admission_reused_input_tokens, b.first_admission_host_reused_input_tokens) == (
        48,
        0,
    )


def test_the_load_waits_for_the_first_byte_latency(tmp_path: Path) -> None:
    *_, b = _replay(tmp_path, [(0, A), (50, C), (100, A)], host={"latency_to_first_byte_ms": 2.0})
    assert b.first_admit_ms == 105.0


def test_reusing_a_gpu_block_still_being_copied_delays_the_pass(tmp_path: Path) -> None:
    """A's 4 MB store is submitted when its prefill ends (10) and lasts to 14. C, admitted at
    12, takes two of A's freed blocks: its pass computes only from 14, first token at 24."""
    _, c, _ = _replay(tmp_path, [(0, A), (12, C), (100, A)])
    assert c.first_admit_ms == 12.0
    assert c.first_token_ms == 24.0


@pytest.mark.parametrize(("h2d", "admitted"), [(0.0, 53.0), (0.5, 59.0), (1.0, 56.0), (2.0, 54.5)])
def test_a_load_into_blocks_still_being_copied_starts_when_the_copy_ends(
    tmp_path: Path, h2d: float, admitted: float
) -> None:
    """At 0.25 GB/s A's store runs 10 -> 26, so C (at 11.5) computes from 26 and its own
    store, refused while its blocks carry A's copy, runs 37 -> 53. B's load of three blocks
    goes into C's freed blocks: it starts at 53 and takes 3 MB at ``h2d``."""
    a, c, b = _replay(
        tmp_path,
        [(0, A), (11.5, C), (12, A)],
        host={"d2h_bandwidth_gbps": 0.25, "h2d_bandwidth_gbps": h2d},
    )
    assert (a.first_token_ms, c.first_token_ms) == (10.0, 36.0)
    assert b.first_admit_ms == admitted
    assert (b.first_admission_reused_input_tokens, b.first_admission_host_reused_input_tokens) == (
        48,
        32,
    )


def test_a_block_evicted_from_host_is_read_back_from_disk(tmp_path: Path) -> None:
    """Host holds four blocks: A's store (10 -> 14) is written on to disk (first byte at
    14.5, 4 MB at 1 GB/s, done 18.5); C's store (30 -> 34) evicts A from host. B at 50:
    A's blocks 2-4 are read from disk (first byte 50.5, 3 MB at 0.5 GB/s, done 56.5), then
    loaded from host (56.5 -> 59.5)."""
    *_, b = _replay(
        tmp_path,
        [(0, A), (20, C), (50, A)],
        host={"num_host_blocks": 4},
        disk={
            "scope": "worker_local",
            "num_g3_blocks": 64,
            "read_bandwidth_gbps": 0.5,
            "write_bandwidth_gbps": 1.0,
            "latency_to_first_byte_ms": 0.5,
        },
    )
    assert b.first_admit_ms == 59.5
    assert b.first_token_ms == 69.5
    assert (b.first_admission_reused_input_tokens, b.first_admission_host_reused_input_tokens) == (
        48,
        32,
    )


def test_host_eviction_takes_the_least_recent_block_and_orders_a_cohort_by_key() -> None:
    """A completed store's blocks become recent together, ordered by key among themselves;
    a lookup touches a prompt's blocks last first, so its first block is the most recent."""
    tier = HostTier(HostOffloadConfig(num_host_blocks=4, d2h_bandwidth_gbps=0.0), 1_000_000)
    first = tier.prepare_store([30, 10, 20], owner=0)
    assert first is not None and tier.lookup(10) is Residency.PENDING
    tier.submit_prepared(0.0)
    tier.advance(0.0)
    assert tier.lru_order() == [10, 20, 30]
    for key in reversed([30, 10, 20]):  # a lookup of the prompt 30, 10, 20
        tier.touch(key)
    assert tier.lru_order() == [20, 10, 30]
    second = tier.prepare_store([40, 50], owner=1)  # one block must go: the least recent
    assert second is not None
    assert tier.lookup(20) is Residency.MISS
    assert tier.lru_order() == [10, 30]
    # A store that would have to evict its own blocks, or pending ones, waits.
    assert tier.prepare_store([60, 70, 80, 90], owner=2) is None
    tier.check()


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"native_host_offload": {"num_host_blocks": 8}}, "requires kv_cache_bytes_per_token"),
        (
            {
                "backend": "sglang",
                "kv_cache_bytes_per_token": 2,
                "native_host_offload": {"num_host_blocks": 8},
            },
            "only for the vllm backend",
        ),
        (
            {"g3_offload": {"scope": "worker_local", "num_g3_blocks": 8}},
            "g3_offload requires native_host_offload",
        ),
        (
            {"kv_cache_bytes_per_token": 2, "native_host_offload": {}},
            "needs 'num_host_blocks'",
        ),
        (
            {
                "kv_cache_bytes_per_token": 2,
                "dp_size": 2,
                "native_host_offload": {"num_host_blocks": 8},
                "g3_offload": {"scope": "worker_local", "num_g3_blocks": 8},
            },
            "g3_offload supports only dp_size=1",
        ),
        (
            {
                "kv_cache_bytes_per_token": 2,
                "native_host_offload": {"num_host_blocks": 8, "d2h_bandwidth_gbps": -1},
            },
            "'d2h_bandwidth_gbps' must be a finite number >= 0.0",
        ),
    ],
)
def test_offload_settings_the_reference_rejects_are_rejected(
    engine: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_engine_args(engine)


def _offload_with_a_store_in_flight() -> HostOffload:
    """A rank's host side (4-token blocks of 1 MB, 1 GB/s each way) where request 1 stored
    its one prompt block, GPU block 0, at 0 ms: the copy reads that block until 1 ms."""
    offload = HostOffload(
        HostOffloadConfig(num_host_blocks=8, d2h_bandwidth_gbps=1.0, h2d_bandwidth_gbps=1.0),
        block_size=4,
        bytes_per_token=250_000,
    )
    first = _tracked(1, ((1, 4),), offload)
    first.blocks, first.num_computed = [0], 4
    offload.observe_computed(first, 0.0)
    offload.boundary(0.0)
    assert offload.tier.deadline(0) == 1.0
    return offload


def _tracked(uid: int, runs: tuple[tuple[int, int], ...], offload: HostOffload) -> EngineRequest:
    request = EngineRequest(uid, RunPrompt(runs, BlockContentCache()), 4)
    offload.track(request, _keys(request))
    return request


def _keys(request: EngineRequest) -> list[int]:
    return request.prompt.sequence_hashes(4, request.prompt_len // 4)


def test_a_prompt_given_a_block_still_being_copied_stores_nothing_until_the_copy_ends() -> None:
    """Request 1 finished; request 2's 8-token prompt gets GPU blocks 0 and 5, and request
    1's store still reads block 0, which went to its first block (the reference hands out
    the block it took last first, see test_an_allocation_hands_out_the_block_taken_last_first).
    Its pass computes from 1 ms, and until that store completes it offers nothing to host:
    its complete first block is block 0; then both its blocks go as one store (the fuzzer's
    `offload` 563, `agg_offload_allocation_awaits_write`)."""
    offload = _offload_with_a_store_in_flight()
    second = _tracked(2, ((2, 4), (3, 4)), offload)
    first_key, second_key = _keys(second)
    second.blocks = [0, 5]
    offload.fence_allocation([0, 5])
    assert offload.fence == 1.0
    second.num_computed = 7  # its first block complete, its second not yet
    offload.observe_computed(second, 0.5)
    assert offload.tier.lookup(first_key) is Residency.MISS
    offload.boundary(1.0)  # request 1's store completes
    second.num_computed = 8
    offload.observe_computed(second, 1.0)
    assert [offload.tier.lookup(k) for k in (first_key, second_key)] == [Residency.PENDING] * 2
    offload.boundary(1.0)
    assert offload.tier.deadline(1) == 3.0  # one 2 MB copy


def test_only_the_block_still_being_copied_holds_a_store_back() -> None:
    """As above, but block 0 went to request 2's second (partial) block: its complete first
    block, in block 5, goes to host at once. The reference refuses a store only a source
    block whose capacity a copy still reads (the fuzzer's `offload` 1469,
    `agg_offload_reused_capacity_order`)."""
    offload = _offload_with_a_store_in_flight()
    second = _tracked(2, ((2, 4), (3, 4)), offload)
    first_key = _keys(second)[0]
    second.blocks = [5, 0]
    offload.fence_allocation([5, 0])
    assert offload.fence == 1.0
    second.num_computed = 7
    offload.observe_computed(second, 0.5)
    assert offload.tier.lookup(first_key) is Residency.PENDING


def test_a_prefix_still_being_copied_is_not_stored_either() -> None:
    """Request 2's allocation gives block 0, which request 1's store still reads, to its
    first block; request 3, admitted in the same pass with the same first block, finds
    block 0 as its cached prefix. Its own new block is free of any store, yet it does not
    store that prefix until the copy ends (the fuzzer's `offload` 1469,
    `agg_offload_store_awaits_write`)."""
    offload = _offload_with_a_store_in_flight()
    second = _tracked(2, ((2, 4), (3, 4)), offload)
    second.blocks = [0, 5]
    offload.fence_allocation([0, 5])
    third = _tracked(3, ((2, 4), (4, 4)), offload)
    third.blocks = [0, 6]
    offload.fence_allocation([6])
    third.num_computed = 7
    offload.observe_computed(third, 0.5)
    assert [offload.tier.lookup(k) for k in _keys(third)] == [Residency.MISS] * 2
    offload.boundary(1.0)
    offload.observe_computed(third, 1.0)
    assert [offload.tier.lookup(k) for k in _keys(third)] == [Residency.PENDING, Residency.MISS]


def test_a_cached_prefix_is_stored_while_the_requests_new_block_awaits_its_write() -> None:
    """A 6-token prompt finds GPU block 5 as its cached prefix (an allocation that awaited
    nothing) and gets block 0, which request 1's store still reads, for its last two
    prompt tokens. Its pass computes from 1 ms, but its first block goes to host at once:
    only the new block awaits its write (the fuzzer's `offload` 1469,
    `agg_offload_partial_block_awaits_write`)."""
    offload = _offload_with_a_store_in_flight()
    second = _tracked(2, ((2, 4), (3, 2)), offload)
    second.blocks = [5, 0]
    offload.fence_allocation([0])
    assert offload.fence == 1.0
    second.num_computed = 6
    offload.observe_computed(second, 0.5)
    assert [offload.tier.lookup(k) for k in _keys(second)] == [Residency.PENDING]


def test_a_new_block_for_output_tokens_holds_no_store_back() -> None:
    """A decoding request whose new block is still read by another store computes after
    it, but offers its prompt to host at once (the fuzzer's `offload` 443)."""
    offload = _offload_with_a_store_in_flight()
    second = _tracked(2, ((2, 4),), offload)
    second.blocks, second.num_computed = [5, 0], 5
    offload.fence_allocation([0])  # the block of its output tokens
    assert offload.fence == 1.0
    offload.observe_computed(second, 0.5)
    assert [offload.tier.lookup(k) for k in _keys(second)] == [Residency.PENDING]


def test_a_waiter_admitted_from_behind_the_connectors_front_is_tried_at_its_old_entry() -> None:
    """The reference keeps the connector's waiters in a queue it trims only at its front
    (`agg_offload_connector_entry_left_behind`, `..._shared`): B, admitted while A waits
    ahead of it, leaves its entry behind. Put off again after C (preempted, say), B is
    tried at that entry, before C, once A has gone from the front."""
    engine = parse_engine_args(
        {
            "block_size": 4,
            "kv_cache_bytes_per_token": 250_000,
            "native_host_offload": {"num_host_blocks": 8},
        }
    )
    timing = PolynomialTiming(engine.total_kv_tokens, 1.0, 1.0)
    rank = VllmScheduler(engine, timing)
    a, b, c = (
        EngineRequest(uid, RunPrompt(((uid, 4),), BlockContentCache()), 1) for uid in range(3)
    )
    for request in (a, b, c):
        rank.submit(request)
    rank._sleep(a)  # put off by the connector, in this order
    rank._sleep(b)
    rank._settle_transfers([], True)  # a transfer completed: every waiter wakes
    assert rank._offload_next() is a
    rank._dequeue(b)  # admitted from behind A: its entry stays
    rank._sleep(c)
    rank.waiting.appendleft(b)  # back in waiting (preempted), then put off again
    rank._sleep(b)
    rank._settle_transfers([], True)
    assert rank._offload_next() is a
    rank._dequeue(a)  # admitted from the front: its entry goes
    assert rank._offload_next() is b  # at its old entry, ahead of C
    rank._dequeue(b)
    assert rank._offload_next() is c


def test_an_allocation_hands_out_the_block_taken_last_first() -> None:
    """With a host tier, a request's new GPU blocks go to its positions in the reverse of
    the order the pool gave them (free ones, then evicted ones, oldest first), as the
    reference's pool hands out its reservation's capacity from the tail: which position
    gets a block a store still reads decides what the request may store meanwhile."""
    engine = parse_engine_args(
        {
            "block_size": 4,
            "num_gpu_blocks": 8,
            "kv_cache_bytes_per_token": 250_000,
            "native_host_offload": {"num_host_blocks": 8},
        }
    )
    rank = VllmScheduler(engine, PolynomialTiming(engine.total_kv_tokens, 1.0, 1.0))
    request = EngineRequest(0, RunPrompt(((0, 12),), BlockContentCache()), 1)
    rank.submit(request)
    rank._allocate(request, 0, 3)
    assert request.blocks == [2, 1, 0]
    rank._allocate(request, 0, 4)  # one more block: nothing to reorder
    assert request.blocks == [2, 1, 0, 3]
