"""The replay shortcuts change nothing, on random workloads (Hypothesis, and one seeded
search too long for CI behind the ``slow`` marker).

Decode fast-forward (against pass-by-pass stepping) together with leaving
unshared blocks unnamed (against hashing every block), over sessions with
think times, closed loops, DP ranks, tight KV pools (evictions and
preemptions), host KV tiers and time caps: every request's record must be
the same, and so must each host tier's recency order.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from servesim.config import Backend, EngineConfig, HostOffloadConfig
from servesim.engine.kv.host_tier import HostTier
from servesim.engine.vllm import VllmScheduler
from servesim.engine.worker import Worker
from servesim.workload.request import BlockContentCache, RequestSpec, Session, TracePrompt
from servesim.workload.sharing import mark_shared_blocks
from tests.support import replay_aggregated

turns = st.lists(
    st.tuples(
        st.lists(st.integers(0, 4), min_size=1, max_size=5),  # hash ids (shared prefixes)
        st.integers(1, 60),  # output tokens: long enough for windows to form
        st.floats(0, 50, allow_nan=False),  # think time before this turn
    ),
    min_size=1,
    max_size=3,
)


def build(sessions_spec: list[tuple[float, list[tuple[list[int], int, float]]]]) -> list[Session]:
    cache = BlockContentCache()
    sessions = []
    for s, (start, session_turns) in enumerate(sessions_spec):
        specs = [
            RequestSpec(
                prompt=TracePrompt(tuple(ids), 8, len(ids) * 8 - 3, cache),
                output_length=output,
                session_id=f"s{s}",
                turn_index=k,
                delay_ms=delay if k else 0.0,
            )
            for k, (ids, output, delay) in enumerate(session_turns)
        ]
        sessions.append(Session(turns=specs, start_ms=start))
    return sessions


def replay(
    sessions_spec: list[tuple[float, list[tuple[list[int], int, float]]]],
    config: EngineConfig,
    workers: int,
    concurrency: int | None,
    cap: float | None,
    fast: bool,
    kv_router: bool = False,
    span: bool = False,
    lru: list[list[int | None]] | None = None,
    host_lru: list[list[int]] | None = None,
) -> list[tuple[object, ...]]:
    """The token-gap sketches' statistics, then each request's record, of a replay.

    ``fast`` turns on the shortcuts (fast-forward windows, the decode cohort, unnamed
    unshared blocks, a window chained after a stepped pass where the command would
    chain one); ``span`` lets windows run past members' last tokens. ``lru``
    receives each rank's evictable blocks at the end, oldest first, as their hashes
    (None: unnamed); ``host_lru`` each host tier's, once a tier.
    """
    sessions = build(sessions_spec)
    if fast:
        mark_shared_blocks(sessions, config.block_size)
    host = config.native_host_offload
    chain = (
        fast and not kv_router and cap is None and config.backend is Backend.VLLM and host is None
    )
    tier = None
    if host is not None and host.scope == "cluster_shared":
        tier = HostTier(host, config.block_size * (config.kv_cache_bytes_per_token or 0))
    pool = [
        Worker(
            i,
            config,
            fast_forward=fast,
            kv_events=kv_router,
            shared_host=None if tier is None else (tier, i * config.dp_size),
            deferred_ends=span,
            chain=chain,
        )
        for i in range(workers)
    ]
    collector, _ = replay_aggregated(
        sessions, config, pool, concurrency=concurrency, max_sim_time_ms=cap, kv_router=kv_router
    )
    if lru is not None:
        for worker in pool:
            for rank in worker.ranks:
                assert isinstance(rank, VllmScheduler)
                lru.append([rank.pool.block_hash(b) for b in rank.pool.lru_order()])
    if host_lru is not None:
        ranks = [rank for worker in pool for rank in worker.ranks]
        tiers = [rank.host_tier for rank in ranks if isinstance(rank, VllmScheduler)]
        host_lru += [tier.lru_order() for tier in dict.fromkeys(tiers) if tier is not None]
    gaps = [(s.describe(), s.count) for s in (collector.itl, collector.per_user)]
    return gaps + [
        (
            r.arrival_time_ms,
            r.first_admit_ms,
            r.first_token_ms,
            r.second_token_ms,
            r.last_token_ms,
            r.output_length,
            r.reused_input_tokens,
            r.selected_overlap_blocks,
            r.worker,
            r.dp_rank,
            r.terminal_status,
            r.terminal_time_ms,
        )
        for r in collector.records
    ]


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        # Token gaps are summed in another order when they are counted per pass.
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def assert_fast_equals_exact(
    sessions_spec: list[tuple[float, list[tuple[list[int], int, float]]]],
    config: EngineConfig,
    workers: int,
    concurrency: int | None,
    cap: float | None,
    kv_router: bool,
) -> None:
    """The replay with the shortcuts and the one stepping every pass give the same records
    and token-gap statistics, and leave each host tier's recency order the same."""
    fast_host: list[list[int]] = []
    exact_host: list[list[int]] = []
    fast = replay(
        sessions_spec, config, workers, concurrency, cap, True, kv_router, host_lru=fast_host
    )
    exact = replay(
        sessions_spec, config, workers, concurrency, cap, False, kv_router, host_lru=exact_host
    )
    assert len(fast) == len(exact)
    for f, e in zip(fast, exact, strict=True):
        assert all(same(a, b) for a, b in zip(f, e, strict=True)), (f, e)
    assert fast_host == exact_host


@settings(max_examples=60, deadline=None)
@given(
    sessions_spec=st.lists(
        st.tuples(st.floats(0, 300, allow_nan=False), turns), min_size=1, max_size=8
    ),
    workers=st.integers(1, 3),
    dp_size=st.integers(1, 2),
    blocks=st.integers(30, 80),
    budget=st.integers(8, 128),
    concurrency=st.one_of(st.none(), st.integers(1, 4)),
    cap=st.one_of(st.none(), st.floats(50, 2000, allow_nan=False)),
    backend=st.sampled_from(list(Backend)),
    host_blocks=st.one_of(st.none(), st.integers(1, 40)),
    host_shared=st.booleans(),
    kv_router=st.booleans(),
)
def test_fast_forward_records_equal_exact_passes(
    sessions_spec: list[tuple[float, list[tuple[list[int], int, float]]]],
    workers: int,
    dp_size: int,
    blocks: int,
    budget: int,
    concurrency: int | None,
    cap: float | None,
    backend: Backend,
    host_blocks: int | None,
    host_shared: bool,
    kv_router: bool,
) -> None:
    """Every request's times, tokens, reuse, placement and status agree in both modes, and
    so do the token-gap statistics (ITL and per-user rate: count, extremes, moments, percentiles).

    vLLM ranks may have a host KV tier (``host_blocks``), with copies slow enough to
    overlap decode stretches (a 4-token block is 1 MB; 0.5 GB/s out, 2 GB/s back), each
    rank's own or one the deployment shares (``host_shared``: copies share its bandwidth). With
    ``kv_router`` the KV router places requests from the KV events both modes publish
    (a window's evictions, scheduled, must show when stepping shows them).
    """
    host = None
    if host_blocks is not None and backend is Backend.VLLM:
        host = HostOffloadConfig(
            num_host_blocks=host_blocks,
            d2h_bandwidth_gbps=0.5,
            h2d_bandwidth_gbps=2.0,
            scope="cluster_shared" if host_shared else "dp_rank_local",
            kv_layout_id="L",
            shared_d2h_bandwidth_gbps=0.8,
            shared_h2d_bandwidth_gbps=3.0,
        )
    config = EngineConfig(
        backend=backend,
        block_size=4,
        num_gpu_blocks=blocks,
        max_num_batched_tokens=budget,
        dp_size=dp_size,
        kv_cache_bytes_per_token=250_000,
        native_host_offload=host,
    )
    assert_fast_equals_exact(sessions_spec, config, workers, concurrency, cap, kv_router)


@settings(max_examples=60, deadline=None)
@given(
    sessions_spec=st.lists(
        st.tuples(st.floats(0, 100, allow_nan=False), turns), min_size=4, max_size=12
    ),
    workers=st.integers(1, 2),
    dp_size=st.integers(1, 2),
    blocks=st.integers(26, 48),  # (a request's 100 tokens at most always fit alone)
    host_blocks=st.integers(4, 60),
    d2h=st.sampled_from([0.0, 0.5, 4.0]),
    concurrency=st.one_of(st.none(), st.integers(2, 8)),
)
@example(  # A window after a boundary made other host blocks recent, then a preempting pass.
    sessions_spec=[
        (18.0, [([0], 55, 0.0)]),
        (19.0, [([4, 3, 1, 2], 50, 0.0)]),
        (39.0, [([1, 1, 1, 2, 2], 23, 0.0)]),
        (0.0, [([0, 2], 47, 0.0)]),
        (0.0, [([0, 0, 0, 3, 2], 36, 0.0)]),
        (42.0, [([1, 0, 2, 4], 25, 0.0)]),
        (0.0, [([0, 3], 40, 0.0)]),
        (87.0, [([0, 1, 4], 37, 0.0)]),
        (76.0, [([1], 18, 0.0)]),
    ],
    workers=2,
    dp_size=1,
    blocks=28,
    host_blocks=17,
    d2h=4.0,
    concurrency=None,
)
def test_windows_while_a_head_waits_beside_a_host_tier_equal_exact_passes(
    sessions_spec: list[tuple[float, list[tuple[list[int], int, float]]]],
    workers: int,
    dp_size: int,
    blocks: int,
    host_blocks: int,
    d2h: float,
    concurrency: int | None,
) -> None:
    """A GPU cache too small for the load, over a host tier of each rank's own: requests
    wait, and windows form while the waiting head's lookups would only touch its host
    blocks as they are. Every record, the token-gap statistics and each host tier's
    recency order are what stepping gives.

    The explicit example was found by a random search against windows that skipped
    a lookup whose touch reordered the tier (a copy's blocks became recent at the
    boundary before), counting on the stepped pass after the window to touch the
    head again: that pass preempted, and looked nothing up."""
    host = HostOffloadConfig(
        num_host_blocks=host_blocks, d2h_bandwidth_gbps=d2h, h2d_bandwidth_gbps=2.0
    )
    config = EngineConfig(
        block_size=4,
        num_gpu_blocks=blocks,
        dp_size=dp_size,
        kv_cache_bytes_per_token=250_000,
        native_host_offload=host,
    )
    assert_fast_equals_exact(sessions_spec, config, workers, concurrency, None, False)


@pytest.mark.slow
@pytest.mark.parametrize("first_seed", range(0, 8000, 1000))
def test_random_loads_beside_a_host_tier_equal_exact_passes(first_seed: int) -> None:
    """The comparison above over 8,000 seeded random loads on round robin, drawn wider
    than Hypothesis draws them (4 to 14 sessions of up to three turns, GPU caches just
    above one request's blocks, host tiers of 4 to 60 blocks, instant to slow copies).
    Without the rule that a blocked head's touch changes nothing, 3 of them differ
    (seeds 1031, 2095 and 4606; the first is the test above's explicit example), where
    1,500 examples from Hypothesis found none."""
    for seed in range(first_seed, first_seed + 1000):
        rng = random.Random(seed)
        sessions_spec = []
        for _ in range(rng.randint(4, 14)):
            session_turns = [
                (
                    [rng.randint(0, 4) for _ in range(rng.randint(1, 5))],
                    rng.randint(1, 60),
                    rng.uniform(0, 50),
                )
                for _ in range(rng.randint(1, 3))
            ]
            sessions_spec.append((rng.uniform(0, 100), session_turns))
        host = HostOffloadConfig(
            num_host_blocks=rng.randint(4, 60),
            d2h_bandwidth_gbps=rng.choice([0.0, 0.5, 4.0]),
            h2d_bandwidth_gbps=2.0,
        )
        config = EngineConfig(
            block_size=4,
            num_gpu_blocks=rng.randint(26, 48),
            dp_size=rng.randint(1, 2),
            kv_cache_bytes_per_token=250_000,
            native_host_offload=host,
        )
        workers = rng.randint(1, 2)
        concurrency = rng.choice([None, rng.randint(2, 8)])
        assert_fast_equals_exact(sessions_spec, config, workers, concurrency, None, False)


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(
        st.tuples(
            st.floats(0, 120, allow_nan=False),  # arrival
            st.lists(st.integers(0, 4), min_size=1, max_size=5),  # hash ids
            st.integers(1, 60),  # output tokens
        ),
        min_size=1,
        max_size=10,
    ),
    workers=st.integers(1, 3),
    dp_size=st.integers(1, 2),
    blocks=st.integers(30, 400),
    budget=st.integers(8, 128),
    caching=st.booleans(),
)
def test_windows_past_last_tokens_equal_exact_passes(
    requests: list[tuple[float, list[int], int]],
    workers: int,
    dp_size: int,
    blocks: int,
    budget: int,
    caching: bool,
) -> None:
    """Where nothing reacts to a request's end (round robin, an open loop of one-turn
    sessions), a window that runs past members' last tokens (their ends stamped at
    their own pass) leaves every record and the token-gap statistics as stepping has
    them, with the free blocks covering the window or not (then it stops at the first
    last token); and the finished requests' blocks wait for eviction in the order
    windows that stop at each last token leave them."""
    config = EngineConfig(
        block_size=4,
        num_gpu_blocks=blocks,
        max_num_batched_tokens=budget,
        dp_size=dp_size,
        enable_prefix_caching=caching,
    )
    spec = [(start, [(ids, output, 0.0)]) for start, ids, output in requests]
    spanning: list[list[int | None]] = []
    stopping: list[list[int | None]] = []
    fast = replay(spec, config, workers, None, None, True, span=True, lru=spanning)
    replay(spec, config, workers, None, None, True, lru=stopping)
    exact = replay(spec, config, workers, None, None, False)
    for f, e in zip(fast, exact, strict=True):
        assert all(same(a, b) for a, b in zip(f, e, strict=True)), (f, e)
    assert spanning == stopping
