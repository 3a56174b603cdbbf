"""The shared-block look-ahead on hand-made prompts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.workload.request import (
    BlockContentCache,
    RequestSpec,
    Session,
    SyntheticPrompt,
    TracePrompt,
)
from servesim.workload.sharing import mark_shared_blocks

CACHE = BlockContentCache()


def trace_spec(ids: list[int], length: int, tbs: int = 8) -> RequestSpec:
    return RequestSpec(prompt=TracePrompt(tuple(ids), tbs, length, CACHE), output_length=1)


def shared(
    specs: list[RequestSpec], block_size: int, pools: list[int] | None = None
) -> list[int | None]:
    mark_shared_blocks([Session(turns=[s], start_ms=0.0) for s in specs], block_size, pools=pools)
    return [s.shared_blocks for s in specs]


def test_common_prefix_counts_for_both_requests() -> None:
    """Two prompts agreeing on their first two ids share the four blocks those ids cover (block 4, trace 8)."""
    a = trace_spec([1, 2, 3], 24)
    b = trace_spec([1, 2, 9], 24)
    assert shared([a, b], 4) == [4, 4]


def test_a_shorter_prompt_limits_what_is_shared() -> None:
    """Only blocks full in both prompts are shared: the other prompt stops at 5 full blocks."""
    a = trace_spec([1, 2, 3], 24)
    b = trace_spec([1, 2, 3], 21)
    c = trace_spec([7], 8)
    assert shared([a, b, c], 4) == [5, 5, 0]


def test_unique_and_synthetic_prompts_share_nothing() -> None:
    """A prompt no other request starts like, and synthetic prompts, have no shared blocks."""
    a = trace_spec([1, 2], 16)
    b = trace_spec([5, 2], 16)
    s = RequestSpec(prompt=SyntheticPrompt(0, 100), output_length=1)
    assert shared([a, b, s], 4) == [0, 0, 0]


def test_engine_blocks_spanning_trace_blocks() -> None:
    """With blocks of 6 over trace blocks of 8, block 1 needs ids 0 and 1, so one shared id shares one block."""
    a = trace_spec([1, 2, 3], 24)
    b = trace_spec([1, 4, 3], 24)
    assert shared([a, b], 6) == [1, 1]


def common_blocks(a: TracePrompt, b: TracePrompt, bs: int) -> int:
    """Full blocks of both prompts that come from ids they agree on (by definition)."""
    full_a, full_b = a.length // bs, b.length // bs
    ids_a = a.tokens[: -(-full_a * bs // a.trace_block_size)]
    ids_b = b.tokens[: -(-full_b * bs // b.trace_block_size)]
    agree = 0
    while agree < min(len(ids_a), len(ids_b)) and ids_a[agree] == ids_b[agree]:
        agree += 1
    return min(agree * a.trace_block_size // bs, full_a, full_b)


@settings(max_examples=300, deadline=None)
@given(
    prompts=st.lists(
        st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=6), st.integers(0, 7)),
        min_size=1,
        max_size=12,
    ),
    tbs=st.sampled_from([4, 6, 8]),
    bs=st.sampled_from([2, 3, 4, 6, 8]),
    pool_count=st.sampled_from([None, 1, 2, 3]),
    data=st.data(),
)
def test_shared_blocks_are_the_most_any_other_request_has_in_common(
    prompts: list[tuple[list[int], int]],
    tbs: int,
    bs: int,
    pool_count: int | None,
    data: st.DataObject,
) -> None:
    """A request shares as many blocks as it has in common with the best other request
    (of its own pool, when each request's pool is given). Given a disaggregated run's
    prefill pools instead, its prefill side counts within them and its decode side over
    the whole workload."""
    specs = [trace_spec(ids, max(1, len(ids) * tbs - cut), tbs) for ids, cut in prompts]
    pools = None
    if pool_count is not None:
        pools = data.draw(
            st.lists(st.integers(0, pool_count - 1), min_size=len(specs), max_size=len(specs))
        )
    prefill = data.draw(st.booleans())
    sessions = [Session(turns=[s], start_ms=0.0) for s in specs]
    if prefill:
        mark_shared_blocks(sessions, bs, prefill_pools=pools)
    else:
        mark_shared_blocks(sessions, bs, pools=pools)
    for i, spec in enumerate(specs):
        if prefill:
            assert spec.shared_blocks == most_in_common(specs, i, bs, None)
            assert spec.prefill_shared_blocks == (
                None if pools is None else most_in_common(specs, i, bs, pools)
            )
        else:
            assert spec.shared_blocks == most_in_common(specs, i, bs, pools)
            assert spec.prefill_shared_blocks is None


def most_in_common(specs: list[RequestSpec], i: int, bs: int, pools: list[int] | None) -> int:
    """The most blocks request ``i`` has in common with another (of its pool, if given)."""
    mine = specs[i].prompt
    assert isinstance(mine, TracePrompt)
    counts = []
    for j, other in enumerate(specs):
        if j != i and (pools is None or pools[j] == pools[i]):
            assert isinstance(other.prompt, TracePrompt)
            counts.append(common_blocks(mine, other.prompt, bs))
    return max(counts, default=0)


def test_requests_on_different_pools_share_nothing() -> None:
    """The same two prompts share four blocks on one pool and none on two."""
    a, b = trace_spec([1, 2, 3], 24), trace_spec([1, 2, 9], 24)
    assert shared([a, b], 4, pools=[0, 0]) == [4, 4]
    assert shared([a, b], 4, pools=[1, 0]) == [0, 0]
