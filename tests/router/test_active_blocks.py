"""The KV router's active shared blocks per target, against the union of its requests' hashes.

With ``router_assume_kv_reuse`` a block shared by active requests on a target
counts once. The router keeps those blocks as a forest (a hash's parent is the
block before it in every chain that holds it) and touches only the blocks a
placement or a free makes active or inactive. Requests here are paths in a
random tree of hashes, so they share prefixes and branch apart at any depth;
after every step the router's view must be the plain union of the active
requests' hashes, target by target, and the blocks it knows to weigh more
than one (an active child or a request ending there, each counting one) the
ones that do.
"""

from __future__ import annotations

import random
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.config import RouterConfig
from servesim.router.kv_router import KvRouter, Placement, RouteRequest

BLOCK = 4
TARGETS = 3

# A step: a new request (its path of branch choices, extra unshared tokens, its
# target) or the end of an active request (an index into those placed).
PATHS = st.lists(st.integers(0, 2), max_size=8)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), PATHS, st.integers(0, 7), st.integers(0, TARGETS - 1)),
        st.tuples(st.just("free"), st.integers(0, 50)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_active_blocks_are_the_union_of_active_requests(steps: list[tuple[object, ...]]) -> None:
    router = KvRouter(
        RouterConfig(router_assume_kv_reuse=True, router_track_active_blocks=True),
        TARGETS,
        BLOCK,
        random.Random(0),
        indexer=None,
    )
    ids: dict[tuple[int, ...], int] = {}  # a path prefix's hash

    def chain(path: list[int]) -> list[int]:
        return [ids.setdefault(tuple(path[: i + 1]), len(ids)) for i in range(len(path))]

    active: dict[int, tuple[int, list[int]]] = {}  # uid -> (target, hashes)
    for uid, step in enumerate(steps):
        if step[0] == "add":
            _, path, extra, target = step
            assert isinstance(path, list) and isinstance(extra, int) and isinstance(target, int)
            hashes = chain(path)
            request = RouteRequest(
                uid=uid,
                isl=len(hashes) * BLOCK + extra,
                blocks=-(-(len(hashes) * BLOCK + extra) // BLOCK),
                hashes=hashes,
            )
            union = [
                {h for t, hs in active.values() if t == target_ for h in hs}
                for target_ in range(TARGETS)
            ]
            expected = {t: len(set(hashes) & union[t]) for t in range(TARGETS)}
            assert router._already_active(request) == {t: n for t, n in expected.items() if n}
            router.add(
                request,
                Placement(target=target, overlap_blocks=0, best_overlap_blocks=0, cached_tokens=0),
            )
            active[uid] = (target, hashes)
        elif active:
            _, index = step
            assert isinstance(index, int)
            uid_ = sorted(active)[index % len(active)]
            router.free(uid_)
            del active[uid_]
        union = [
            {h for t, hs in active.values() if t == target_ for h in hs}
            for target_ in range(TARGETS)
        ]
        assert router._shared is not None
        for t in range(TARGETS):
            assert set(router._shared[t]) == union[t]
            assert int(router._shared_count[t]) == len(union[t])
            assert router._branches[t] == _branch_weights(
                [hs for t_, hs in active.values() if t_ == t]
            )
        roots = {hs[0] for _, hs in active.values() if hs}
        assert router._root_on == {
            root: sum(1 << t for t in range(TARGETS) if root in union[t]) for root in roots
        }


def _branch_weights(chains: list[list[int]]) -> dict[int, int]:
    """Each block's active children plus the requests ending there, where that is above 1."""
    children: dict[int, set[int]] = {}
    ends: dict[int, int] = {}
    for hashes in chains:
        for parent, child in pairwise(hashes):
            children.setdefault(parent, set()).add(child)
        if hashes:
            ends[hashes[-1]] = ends.get(hashes[-1], 0) + 1
    weights = {h: len(children.get(h, ())) + ends.get(h, 0) for h in children.keys() | ends}
    return {h: w for h, w in weights.items() if w > 1}
