"""The block pool against a plain model of its rules (Hypothesis).

The model keeps what the pool promises in the most direct form: each hashed
block's hash and holders, each hash's cached copies in the order they were
cached, the private blocks, and the inactive blocks as one list, oldest first,
a block leaving it when a prefix hit takes it back. Random requests on a few
shared chains of hashes allocate (prefix hits, fresh blocks, evictions),
compute their blocks at once or a step later (after the next request allocated,
so that two requests may cache copies of one block), and release after a few steps. After each step the pool
must agree with the model on what a prompt matches, which blocks an
allocation takes and evicts, the LRU order, the counts and the KV events, and
pass its own :meth:`~servesim.engine.kv.block_pool.BlockPool.check`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.engine.kv.block_pool import BlockPool, KvEvent, KvRemoved, KvStored

CAPACITY = 24
CHAINS = 3
CHAIN_LENGTH = 12


def chain_hashes(chain: int) -> list[int]:
    """A chain's sequence hashes (distinct across chains)."""
    return [1000 * (chain + 1) + i for i in range(CHAIN_LENGTH)]


@dataclass
class Model:
    """The pool's rules, spelled out."""

    holders: dict[int, int] = field(default_factory=dict)  # hashed block -> references
    hash_of: dict[int, int] = field(default_factory=dict)  # hashed block -> its hash
    copies: dict[int, list[int]] = field(default_factory=dict)  # hash -> blocks, first first
    private: set[int] = field(default_factory=set)  # held, not hashed
    lru: list[int] = field(default_factory=list)  # inactive blocks, oldest first

    def match(self, hashes: list[int], limit: int) -> tuple[int, int]:
        active = 0
        for hits, h in enumerate(hashes[:limit]):
            if h not in self.copies:
                return hits, active
            if self.holders[self.copies[h][0]] > 0:
                active += 1
        return min(len(hashes), limit), active

    def num_free(self) -> int:
        return CAPACITY - len(self.private) - len(self.hash_of)

    def evict(self, count: int) -> tuple[list[int], list[int]]:
        """The blocks ``count`` evictions take, oldest first, and the hashes they remove."""
        evicted, self.lru = self.lru[:count], self.lru[count:]
        removed = []
        for block in evicted:
            h = self.hash_of.pop(block)
            del self.holders[block]
            self.copies[h].remove(block)
            if not self.copies[h]:
                del self.copies[h]
                removed.append(h)
        return evicted, removed

    def cache(self, table: list[int], hashes: list[int], start: int) -> list[KvEvent]:
        """Blocks ``table[start:len(hashes)]`` computed; the Stored events they publish."""
        events: list[KvEvent] = []
        run: list[int] = []
        for i in range(start, len(hashes)):
            block, h = table[i], hashes[i]
            self.private.remove(block)
            self.hash_of[block] = h
            self.holders[block] = 1
            if h in self.copies:  # an extra copy: it ends the run before it
                self.copies[h].append(block)
                if run:
                    events.append(
                        KvStored(hashes[i - len(run) - 1] if i > len(run) else None, tuple(run))
                    )
                    run = []
                continue
            self.copies[h] = [block]
            run.append(h)
        if run:
            first = len(hashes) - len(run)
            events.append(KvStored(hashes[first - 1] if first else None, tuple(run)))
        return events

    def release(self, table: list[int]) -> None:
        for block in reversed(table):
            if block in self.private:
                self.private.remove(block)  # to the free list
                continue
            self.holders[block] -= 1
            if not self.holders[block]:
                self.lru.append(block)


@dataclass
class Held:
    table: list[int]
    hashes: list[int]
    hits: int
    steps: int  # before its release
    computed: bool


requests = st.lists(
    st.tuples(
        st.integers(0, CHAINS - 1),  # its chain
        st.integers(1, CHAIN_LENGTH),  # its prompt's blocks
        st.integers(0, 3),  # uncached blocks after them (private)
        st.booleans(),  # computed at once (else at the next step)
        st.booleans(),  # cached from its first block (its prefix hits passed over)
        st.integers(0, 3),  # steps it stays before its release
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(requests)
def test_the_pool_matches_allocates_evicts_and_publishes_as_its_model(
    drawn: list[tuple[int, int, int, bool, bool, int]],
) -> None:
    events: list[KvEvent] = []
    pool = BlockPool(CAPACITY, events=events)
    model = Model()
    held: list[Held] = []

    def compute(request: Held, from_start: bool) -> None:
        events.clear()
        expected = model.cache(request.table, request.hashes, request.hits)
        pool.cache(
            request.table, request.hashes, 0 if from_start else request.hits, len(request.hashes)
        )
        assert events == expected
        request.computed = True

    for chain, blocks, private, at_once, from_start, stay in drawn:
        waiting = [request for request in held if not request.computed]
        hashes = chain_hashes(chain)[:blocks]
        assert pool.match_prefix(hashes, blocks) == model.match(hashes, blocks)
        hits = model.match(hashes, blocks)[0]
        prefix, new = hashes[:hits], blocks - hits + private
        picks = [model.copies[h][0] for h in prefix]
        taken_back = [block for block in picks if model.holders[block] == 0]
        shortfall = new - model.num_free()
        table: list[int] = []
        events.clear()
        if shortfall > len(model.lru) - len(taken_back):
            assert not pool.allocate(table, prefix, new)
            assert table == [] and events == []
        else:
            in_use = model.private | model.hash_of.keys()
            assert pool.allocate(table, prefix, new)
            assert table[:hits] == picks
            for block in picks:
                model.holders[block] += 1
            model.lru = [block for block in model.lru if block not in taken_back]
            removed: list[int] = []
            if shortfall > 0:
                evicted, removed = model.evict(shortfall)
                assert table[len(table) - shortfall :] == evicted
                in_use -= set(evicted)
            fresh = table[hits:]
            assert len(set(fresh)) == len(fresh) and not in_use & set(fresh)
            assert events == ([KvRemoved(tuple(removed))] if removed else [])
            model.private.update(fresh)
            held.append(Held(table, hashes, hits, stay, computed=False))
            if at_once:
                waiting.append(held[-1])
        # Those allocated at an earlier step compute after this allocation (which could not
        # match their blocks yet), then this one if at once: copies of one block may result.
        for request in waiting:
            compute(request, from_start)
        # Requests whose time is up release their blocks, chain tails first into the LRU.
        for request in list(held):
            if request.steps:
                request.steps -= 1
                continue
            held.remove(request)
            model.release(request.table)
            pool.release(request.table)
        pool.check([request.table for request in held])
        assert pool.lru_order() == model.lru
        assert (pool.num_free, pool.num_inactive) == (model.num_free(), len(model.lru))
