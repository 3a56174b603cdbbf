"""The KV indexer against a plain model: one set of held hashes per target.

Random Stored and Removed events (hashes repeated within and across events,
several targets holding the same blocks) then random look-ups: each target's
overlap must be the count of the look-up's leading hashes its set holds, for
every target that holds the first, and nothing for the others.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.engine.kv.block_pool import KvEvent, KvRemoved, KvStored
from servesim.router.indexer import KvIndexer

TARGETS = 5
hashes = st.lists(st.integers(0, 12), min_size=1, max_size=8)
events = st.lists(
    st.tuples(st.integers(0, TARGETS - 1), st.booleans(), hashes), min_size=1, max_size=40
)


def _model_overlaps(held: list[set[int]], chain: list[int]) -> dict[int, int]:
    found = {}
    for target, blocks in enumerate(held):
        depth = 0
        while depth < len(chain) and chain[depth] in blocks:
            depth += 1
        if depth:
            found[target] = depth
    return found


@settings(max_examples=200, deadline=None)
@given(events, st.lists(st.lists(st.integers(0, 12), max_size=10), min_size=1, max_size=10))
def test_overlaps_match_a_set_per_target(
    history: list[tuple[int, bool, list[int]]], lookups: list[list[int]]
) -> None:
    index = KvIndexer()
    held: list[set[int]] = [set() for _ in range(TARGETS)]
    for target, stored, blocks in history:
        event: KvEvent = KvStored(None, tuple(blocks)) if stored else KvRemoved(tuple(blocks))
        index.apply(target, [event])
        if stored:
            held[target].update(blocks)
        else:
            held[target].difference_update(blocks)
        for block in blocks:
            assert index.holders(block) == {t for t in range(TARGETS) if block in held[t]}
        # Look-ups between events too: the index remembers the first blocks it was asked
        # about, and the events must keep what it remembers current.
        for chain in lookups[:2]:
            assert index.overlaps(chain) == _model_overlaps(held, chain)
    for chain in lookups:
        assert index.overlaps(chain) == _model_overlaps(held, chain)
