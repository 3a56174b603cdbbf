"""The KV router prices all targets at once exactly as the reference prices one.

``select`` computes every target's cost with array operations;
:func:`reference_cost` below is the reference's per-target formula in plain
Python floats. Random sequences of placements, prefill completions and
frees, under random router configs, must leave the two equal bit for bit,
and ``select`` must pick what the per-target costs would (the same seeded
tie-breaks and samples).
"""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.config import RouterConfig
from servesim.router.kv_router import KvRouter, Overlaps, Placement, RouteRequest

BLOCK = 4

CONFIGS = st.builds(
    RouterConfig,
    overlap_score_credit=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    overlap_score_credit_decay=st.sampled_from([0.0, 0.3, 2.0]),
    prefill_load_scale=st.sampled_from([0.0, 1.0, 1.3]),
    decode_active_request_weight=st.sampled_from([0.0, 0.5, 3.0]),
    router_temperature=st.sampled_from([0.0, 0.0, 0.4]),
    router_track_active_blocks=st.booleans(),
    router_assume_kv_reuse=st.booleans(),
    router_track_prefill_tokens=st.booleans(),
    host_cache_hit_weight=st.sampled_from([0.0, 0.75, 0.3]),
)

# A request: prompt tokens, its shareable leading hashes (a prefix of a small
# universe, so requests share), and cached device and host block counts per target.
REQUESTS = st.tuples(
    st.integers(1, 64),
    st.integers(0, 6),
    st.dictionaries(st.integers(0, 5), st.integers(0, 6), max_size=4),
    st.dictionaries(st.integers(0, 5), st.integers(1, 6), max_size=3),
)


def make_request(uid: int, isl: int, shared: int, family: int) -> RouteRequest:
    full = isl // BLOCK
    hashes = [family * 100 + i for i in range(min(shared, full))]
    return RouteRequest(uid=uid, isl=isl, blocks=-(-isl // BLOCK), hashes=hashes)


def reference_cost(
    router: KvRouter, request: RouteRequest, target: int, overlap: int, host: int = 0
) -> float:
    """The reference's cost of one target, one Python float operation at a time."""
    config, bs = router.config, router.block_size
    tokens = router.prefill_tokens(target)
    prefill = 0.0
    decay = 1.0
    if config.router_track_prefill_tokens:
        prefill = (tokens + request.isl) / bs
        if config.overlap_score_credit_decay > 0:
            least = min(router.prefill_tokens(t) for t in range(router.targets))
            excess = (tokens - least) / bs
            decay = 1.0 / (
                1.0 + config.overlap_score_credit_decay * excess / max(request.blocks, 1)
            )
    credit = config.overlap_score_credit * decay * overlap
    if host:
        credit += config.host_cache_hit_weight * host
    blocks = request.isl // bs
    unique = int(router._unique[target])
    if not config.router_track_active_blocks:
        decode = float(blocks)
    elif router._shared is None:
        decode = float(unique + blocks)
    else:
        shared = router._shared[target]
        already = sum(map(shared.__contains__, request.hashes))
        decode = float(len(shared) + unique + blocks - already)
    return (
        config.prefill_load_scale * max(0.0, prefill - credit)
        + decode
        + config.decode_active_request_weight * int(router._requests[target])
    )


def reference_choice(router: KvRouter, costs: list[float], rng: random.Random) -> int:
    """The selection rule over a list of per-target costs, as the router defines it."""
    temperature = router.config.router_temperature
    low = min(costs)
    if temperature <= 0:
        best = [i for i, c in enumerate(costs) if c == low]
        return best[0] if len(best) == 1 else rng.choice(best)
    high = max(costs)
    if high == low:
        return rng.randrange(len(costs))
    scale = (high - low) * temperature
    weights = [math.exp(-(c - low) / scale) for c in costs]
    return rng.choices(range(len(costs)), weights=weights)[0]


@settings(max_examples=150, deadline=None)
@given(
    CONFIGS,
    st.integers(1, 6),
    st.lists(st.tuples(REQUESTS, st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=25),
    st.integers(0, 1000),
)
def test_all_target_costs_equal_the_per_target_formula(
    config: RouterConfig,
    targets: int,
    steps: list[tuple[tuple[int, int, dict[int, int], dict[int, int]], int, int]],
    seed: int,
) -> None:
    router = KvRouter(config, targets, BLOCK, random.Random(seed), indexer=None)
    twin = random.Random(seed)
    placed: list[int] = []
    for uid, ((isl, shared, raw_device, raw_host), family, action) in enumerate(steps):
        request = make_request(uid, isl, shared, family)
        device = {t: n for t, n in raw_device.items() if t < targets}
        host = {t: n for t, n in raw_host.items() if t < targets}
        overlaps = Overlaps(device, host)
        active = router._already_active(request)
        costs = router._costs(request, overlaps, active).tolist()
        expected = [
            reference_cost(router, request, t, device.get(t, 0), host.get(t, 0))
            for t in range(targets)
        ]
        assert costs == expected
        # cost() is one of them, with or without the active counts worked out beforehand.
        assert [
            router.cost(request, t, device.get(t, 0), host=host.get(t, 0)) for t in range(targets)
        ] == expected
        assert [
            router.cost(
                request, t, device.get(t, 0), host=host.get(t, 0), already_active=active.get(t, 0)
            )
            for t in range(targets)
        ] == expected
        placement = router.select(request, overlaps=overlaps)
        assert placement.target == reference_choice(router, expected, twin)
        router.add(request, placement)
        placed.append(uid)
        if action == 1:
            router.prefill_completed(placed[len(placed) // 2])
        elif action == 2 and placed:
            router.free(placed.pop(0))
        assert router.all_loaded_beyond(-1) == all(
            router.prefill_tokens(t) > -1 for t in range(targets)
        )


def test_a_placement_loads_and_a_free_unloads_the_arrays() -> None:
    """Adding then freeing every request returns every target's load to zero."""
    router = KvRouter(RouterConfig(), 3, BLOCK, random.Random(0), indexer=None)
    requests = [make_request(uid, 16, 2, uid % 2) for uid in range(4)]
    for uid, request in enumerate(requests):
        router.add(
            request,
            Placement(target=uid % 3, overlap_blocks=0, best_overlap_blocks=0, cached_tokens=0),
        )
    assert [router.prefill_tokens(t) for t in range(3)] == [32, 16, 16]
    assert router._shared_count.tolist() == [4, 2, 2]  # target 0 holds both families
    for uid in range(4):
        router.free(uid)
    assert router._prefill.tolist() == router._requests.tolist() == [0, 0, 0]
    assert router._unique.tolist() == router._shared_count.tolist() == [0, 0, 0]
    assert router._root_on == {}


@given(
    st.dictionaries(st.integers(0, 5), st.integers(0, 40), max_size=6),
    st.dictionaries(st.integers(0, 5), st.integers(1, 40), max_size=3),
    st.sampled_from([0.0, 0.3, 0.75, 1.0]),
)
def test_best_effective_overlap_is_the_largest_per_target_one(
    device: dict[int, int], host: dict[int, int], weight: float
) -> None:
    """The largest effective overlap over the targets holding any block (device counts
    alone need no per-target weighting: the largest count, as a float)."""
    router = KvRouter(
        RouterConfig(host_cache_hit_weight=weight), 6, BLOCK, random.Random(0), indexer=None
    )
    overlaps = Overlaps(device, host)
    per_target = [router.effective(overlaps, t) for t in device.keys() | host.keys()]
    best = router.best_effective(overlaps)
    assert best == max(per_target, default=0.0)
    assert type(best) is float
