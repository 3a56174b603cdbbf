"""The KV router on hand-computed cases: indexer, cost, selection, queue order."""

from __future__ import annotations

import random

import pytest

from servesim.config import RouterConfig
from servesim.engine.kv.block_pool import KvRemoved, KvStored
from servesim.router.indexer import KvIndexer
from servesim.router.kv_router import KvRouter, Placement, RouteRequest
from servesim.router.queue import RouterQueue
from servesim.router.routing import KvPolicy


def request(uid: int, isl: int, hashes: list[int], block_size: int = 4) -> RouteRequest:
    return RouteRequest(uid=uid, isl=isl, blocks=-(-isl // block_size), hashes=hashes)


# ----- indexer -----


def test_overlap_is_the_longest_held_prefix_per_target() -> None:
    """Each target's overlap counts leading hashes it holds, up to its first miss."""
    index = KvIndexer()
    index.apply(0, [KvStored(None, (1, 2, 3))])
    index.apply(1, [KvStored(None, (1,)), KvStored(1, (2,))])
    index.apply(2, [KvStored(None, (9,))])
    assert index.overlaps([1, 2, 3, 4]) == {0: 3, 1: 2}
    assert index.overlaps([9, 2]) == {2: 1}
    assert index.overlaps([5]) == {}


def test_removed_in_the_middle_of_a_chain_cuts_the_overlap() -> None:
    """A Removed block stops the match there, though later blocks are still held."""
    index = KvIndexer()
    index.apply(0, [KvStored(None, (1, 2, 3, 4))])
    index.apply(0, [KvRemoved((2,))])
    assert index.overlaps([1, 2, 3, 4]) == {0: 1}
    assert index.holders(3) == frozenset({0})


def test_removed_on_one_target_leaves_the_others() -> None:
    """Removal is per target: another holder keeps the block."""
    index = KvIndexer()
    index.apply(0, [KvStored(None, (1, 2))])
    index.apply(1, [KvStored(None, (1, 2))])
    index.apply(1, [KvRemoved((1,))])
    assert index.overlaps([1, 2]) == {0: 2}


# ----- cost -----


def router(
    config: RouterConfig | None = None, targets: int = 2, indexer: KvIndexer | None = None
) -> KvRouter:
    return KvRouter(config or RouterConfig(), targets, 4, random.Random(0), indexer=indexer)


def test_cost_of_an_idle_target_is_prefill_blocks_less_overlap_plus_decode_blocks() -> None:
    """Idle target, 16-token prompt (4 blocks), 2 cached: (16/4 - 2) + 4 = 6; uncached target: 4 + 4 = 8."""
    r = router()
    req = request(0, 16, [11, 12, 13, 14])
    assert r.cost(req, 0, overlap=2) == 6.0
    assert r.cost(req, 1, overlap=0) == 8.0


def test_cost_counts_load_and_shared_active_blocks_once() -> None:
    """After placing a request, its uncached tokens load the target and its blocks are active there."""
    r = router()
    first = request(0, 16, [11, 12, 13, 14])
    r.add(first, Placement(target=0, overlap_blocks=1, best_overlap_blocks=1, cached_tokens=4))
    second = request(1, 8, [11, 12])
    # Target 0: prefill (12 + 8) / 4 = 5, decode 4 active + 0 new (both hashes active) = 4 -> 9.
    assert r.cost(second, 0, overlap=0) == 9.0
    r.prefill_completed(0)
    assert r.cost(second, 0, overlap=0) == 6.0  # prompt load gone: 8/4 + 4
    r.free(0)
    assert r.cost(second, 0, overlap=0) == 4.0  # idle again: 2 + 2


def test_cost_without_kv_reuse_counts_every_block() -> None:
    """With router_assume_kv_reuse off, a block shared by two requests counts twice."""
    r = router(RouterConfig(router_assume_kv_reuse=False, router_track_prefill_tokens=False))
    r.add(
        request(0, 16, [11, 12, 13, 14]),
        Placement(target=0, overlap_blocks=0, best_overlap_blocks=0, cached_tokens=0),
    )
    assert r.cost(request(1, 8, [11, 12]), 0, overlap=2) == 6.0  # 4 active + 2 new, no prefill term


def test_overlap_credit_and_load_scale_and_request_weight() -> None:
    """cost = scale x max(0, prefill - credit x overlap) + decode + weight x requests."""
    config = RouterConfig(
        overlap_score_credit=0.5, prefill_load_scale=2.0, decode_active_request_weight=3.0
    )
    r = router(config)
    r.add(
        request(0, 8, []),
        Placement(target=0, overlap_blocks=0, best_overlap_blocks=0, cached_tokens=0),
    )
    req = request(1, 16, [21, 22, 23, 24])
    # Target 0: prefill (8 + 16) / 4 = 6, credit 0.5 x 4 = 2 -> 2 x 4 = 8; decode 2 + 4 = 6; 3 x 1 request.
    assert r.cost(req, 0, overlap=4) == 8.0 + 6.0 + 3.0


# ----- selection -----


def test_selection_takes_the_cheapest_target_and_reports_overlaps() -> None:
    """The target holding the prefix wins; the placement reports its overlap and the best available."""
    index = KvIndexer()
    index.apply(1, [KvStored(None, (11, 12))])
    r = router(indexer=index, targets=3)
    placement = r.select(request(0, 16, [11, 12, 13, 14]))
    assert placement == Placement(
        target=1, overlap_blocks=2, best_overlap_blocks=2, cached_tokens=8
    )


def test_ties_are_broken_by_the_seeded_generator() -> None:
    """Equal costs: the choice depends only on the seed, so runs repeat."""
    picks = []
    for _ in range(2):
        r = KvRouter(RouterConfig(), 4, 4, random.Random(7), indexer=None)
        picks.append([r.select(request(i, 16, [])).target for i in range(8)])
    assert picks[0] == picks[1]
    assert len(set(picks[0])) > 1


def test_temperature_samples_cheaper_targets_more_often() -> None:
    """With a temperature, the cheaper target is chosen more often, but not always."""
    index = KvIndexer()
    index.apply(0, [KvStored(None, (11, 12, 13))])
    r = KvRouter(RouterConfig(router_temperature=1.0), 2, 4, random.Random(1), indexer=index)
    chosen = [r.select(request(0, 16, [11, 12, 13, 14])).target for _ in range(400)]
    assert 200 < chosen.count(0) < 400


# ----- queue -----


def drain(queue: RouterQueue[str]) -> list[str]:
    return [queue.pop() for _ in range(len(queue))]


@pytest.mark.parametrize(
    ("policy", "order"),
    [("fcfs", ["a", "b", "c"]), ("lcfs", ["c", "b", "a"]), ("wspt", ["b", "c", "a"])],
)
def test_queue_policies_order(policy: str, order: list[str]) -> None:
    """fcfs: earliest first; lcfs: latest first; wspt: shortest uncached prompt first."""
    queue: RouterQueue[str] = RouterQueue(policy)
    queue.push("a", now=0.0, isl=1000, best_cached_tokens=0)
    queue.push("b", now=10.0, isl=400, best_cached_tokens=300)
    queue.push("c", now=20.0, isl=500, best_cached_tokens=0)
    assert drain(queue) == order


def test_strict_priority_first_then_priority_jump() -> None:
    """A higher strict priority goes first; within it a priority jumps the fcfs order."""
    queue: RouterQueue[str] = RouterQueue("fcfs")
    queue.push("late-urgent", now=30.0, isl=10, best_cached_tokens=0, strict_priority=1)
    queue.push("early", now=0.0, isl=10, best_cached_tokens=0)
    queue.push("jumped", now=20.0, isl=10, best_cached_tokens=0, priority=1)
    assert drain(queue) == ["late-urgent", "jumped", "early"]


def test_policy_queues_while_every_target_is_busy_and_drains_on_prefill_completion() -> None:
    """Threshold 1.0 x 8 tokens: a target with more than 8 uncached tokens in flight is busy."""
    config = RouterConfig(router_queue_threshold=1.0)
    policy = KvPolicy(KvRouter(config, 1, 4, random.Random(0), indexer=None), 1, config, 8)
    assert [r.uid for r in policy.place(request(0, 16, []), 0.0)] == [0]  # idle: placed, now busy
    assert policy.place(request(1, 16, []), 5.0) == []  # every target busy: queued
    assert policy.pending == 1
    released = policy.prefill_completed(0, 12.0)
    assert [(r.uid, r.queued_ms) for r in released] == [(1, 7.0)]
