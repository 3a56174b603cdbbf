"""Narrative tests of the vLLM block pool: block ids, LRU eviction order, KV events."""

from __future__ import annotations

import pytest

from servesim.engine.kv.block_pool import BlockPool, KvEvent, KvRemoved, KvStored


def make_pool(capacity: int) -> tuple[BlockPool, list[KvEvent]]:
    events: list[KvEvent] = []
    return BlockPool(capacity, events=events), events


def test_fresh_blocks_come_from_the_free_list_in_order() -> None:
    """A first allocation takes block ids 0, 1, 2 and publishes nothing until cached."""
    pool, events = make_pool(4)
    table: list[int] = []
    assert pool.allocate(table, [], 3)
    assert table == [0, 1, 2]
    assert (pool.num_free, pool.num_active, pool.num_inactive) == (1, 3, 0)
    assert events == []


def test_caching_publishes_one_stored_run_with_its_parent() -> None:
    """Blocks cached together form one Stored event chained after the previous block."""
    pool, events = make_pool(4)
    table: list[int] = []
    pool.allocate(table, [], 3)
    pool.cache(table, [11, 12, 13], 0, 1)
    pool.cache(table, [11, 12, 13], 1, 3)
    assert events == [KvStored(None, (11,)), KvStored(11, (12, 13))]


def test_caching_passes_over_a_reused_block_and_splits_its_runs_at_an_extra_copy() -> None:
    """A block that already holds a hash (a prefix copy) is left out of the Stored runs
    without ending one; a block whose hash another block already shows becomes an extra
    copy, publishes nothing and ends the run before it."""
    pool, events = make_pool(8)
    a: list[int] = []
    pool.allocate(a, [], 2)
    pool.cache(a, [1, 2], 0, 2)
    b: list[int] = []
    assert pool.allocate(b, [1], 3)  # block 0 by a prefix hit, then 2, 3, 4
    events.clear()
    pool.cache(b, [1, 5, 2, 6], 0, 4)  # block 3 would show hash 2, which block 1 shows
    assert events == [KvStored(1, (5,)), KvStored(2, (6,))]
    assert pool.block_hash(3) == 2 and pool.contains(2)
    pool.check([a, b])


def test_release_puts_the_chain_tail_first_in_the_lru() -> None:
    """Releasing in reverse makes the last block the oldest inactive one; private blocks go free."""
    pool, _ = make_pool(4)
    table: list[int] = []
    pool.allocate(table, [], 4)
    pool.cache(table, [11, 12, 13], 0, 3)  # block 3 stays private (partial)
    pool.release(table)
    assert pool.lru_order() == [2, 1, 0]
    assert (pool.num_free, pool.num_inactive, pool.num_active) == (1, 3, 0)
    pool.check()


def test_allocation_evicts_oldest_inactive_and_reports_removed() -> None:
    """When the free list is empty the LRU head (the chain tail) is evicted first."""
    pool, events = make_pool(4)
    first: list[int] = []
    pool.allocate(first, [], 4)
    pool.cache(first, [11, 12, 13, 14], 0, 4)
    pool.release(first)
    events.clear()
    second: list[int] = []
    assert pool.allocate(second, [], 2)
    assert second == [3, 2]
    assert events == [KvRemoved((14, 13))]
    assert pool.contains(11) and pool.contains(12) and not pool.contains(13)


def test_prefix_reuse_pins_inactive_copies_without_using_free_blocks() -> None:
    """A cached prefix is reused in place: out of the LRU, referenced, no new block."""
    pool, _ = make_pool(4)
    first: list[int] = []
    pool.allocate(first, [], 3)
    pool.cache(first, [11, 12, 13], 0, 3)
    pool.release(first)
    assert pool.match_prefix([11, 12, 99], 3) == (2, 0)
    second: list[int] = []
    assert pool.allocate(second, [11, 12], 1)
    assert second == [0, 1, 3]
    assert pool.lru_order() == [2]
    assert pool.match_prefix([11, 12, 13], 3) == (3, 2)
    pool.check()


def test_recycled_blocks_follow_the_ids_never_used() -> None:
    """The free list is every id not yet used, in order, then released blocks in release order."""
    pool, _ = make_pool(8)
    first: list[int] = []
    pool.allocate(first, [], 3)
    pool.release(first)  # private blocks: to the free list's tail, last block first
    assert pool.num_free == 8
    second: list[int] = []
    assert pool.allocate(second, [], 7)
    assert second == [3, 4, 5, 6, 7, 2, 1]
    assert pool.num_free == 1
    pool.check([second])


def test_per_block_state_grows_with_the_blocks_used_not_the_capacity() -> None:
    """A large, little-used pool keeps state for the blocks handed out only."""
    pool, _ = make_pool(1 << 20)
    table: list[int] = []
    pool.allocate(table, [], 3)
    pool.release(table)
    assert pool.allocate(table, [], 2)
    assert table == [3, 4]
    assert len(pool._refs) == len(pool._hash) == 5
    assert pool.num_free == (1 << 20) - 2
    pool.check([table])


def test_a_released_run_is_evicted_whole_or_in_part_oldest_first() -> None:
    """A request's own computed blocks enter the LRU as one run, behind older entries;
    an allocation takes the free blocks, then evicts from the LRU head, splitting the run."""
    pool, events = make_pool(8)
    named: list[int] = []
    pool.allocate(named, [], 1)
    pool.cache(named, [21], 0, 1)
    own: list[int] = []
    pool.allocate(own, [], 5)
    pool.release(named)  # block 0 (hash 21) becomes inactive first
    pool.release(own, 0, 3)  # blocks 1-3 computed: one run; blocks 4, 5 private: freed
    assert pool.lru_order() == [0, 3, 2, 1]  # last block first, as blocks are released
    assert pool.num_inactive == 4 and pool.num_free == 4
    taken: list[int] = []
    assert pool.allocate(taken, [], 6)  # 6, 7, then freed 5, 4, then evict 0 and run block 3
    assert taken == [6, 7, 5, 4, 0, 3]
    assert pool.lru_order() == [2, 1] and events[-1] == KvRemoved((21,))
    pool.check([taken])


def test_allocate_one_takes_the_same_block_as_allocate() -> None:
    """Never-used ids, then freed ones oldest first, then the LRU head: as allocate(table, [], 1)."""
    one, _ = make_pool(4)
    many, _ = make_pool(4)
    for pool in (one, many):
        named: list[int] = []
        pool.allocate(named, [], 2)
        pool.cache(named, [31, 32], 0, 2)
        private: list[int] = []
        pool.allocate(private, [], 2)
        pool.release(named)  # blocks 1, 0 become inactive (hashes 32, 31)
        pool.release(private)  # blocks 3, 2 are freed
    taken_one: list[int] = []
    taken_many: list[int] = []
    for _ in range(4):
        assert one.allocate_one(taken_one)
        assert many.allocate(taken_many, [], 1)
    assert taken_one == taken_many == [3, 2, 1, 0]
    assert not one.allocate_one(taken_one) and taken_one == [3, 2, 1, 0]
    one.check([taken_one])


def test_check_catches_a_free_list_entry_never_handed_out() -> None:
    """An id beyond those handed out is free by construction: listing it again would give it out twice."""
    pool, _, _ = shared_prefix_state()
    pool._free.append(5)  # ids 4 and 5 have never been handed out
    with pytest.raises(AssertionError, match="not a block id handed out"):
        pool.check()


def test_check_catches_a_table_listing_a_block_never_handed_out() -> None:
    """A table cannot hold a block the pool never gave out."""
    pool, a, b = shared_prefix_state()
    with pytest.raises(AssertionError, match="lists block 4, never handed out"):
        pool.check([a, [*b, 4]])


def test_allocation_that_cannot_fit_changes_nothing() -> None:
    """Not fitting is a return value, and the pool is left exactly as it was."""
    pool, _ = make_pool(3)
    table: list[int] = []
    pool.allocate(table, [], 2)
    other: list[int] = []
    assert not pool.allocate(other, [], 2)
    assert other == [] and pool.num_free == 1 and pool.num_active == 2


def test_duplicate_copies_keep_the_hash_visible_until_the_last_goes() -> None:
    """Two copies of one hash: one Stored, and Removed only when the second copy is evicted."""
    pool, events = make_pool(2)
    a: list[int] = []
    b: list[int] = []
    pool.allocate(a, [], 1)
    pool.allocate(b, [], 1)
    pool.cache(a, [7], 0, 1)
    pool.cache(b, [7], 0, 1)
    assert events == [KvStored(None, (7,))]
    pool.release(a)
    pool.release(b)
    c: list[int] = []
    pool.allocate(c, [], 1)
    assert events[1:] == [] and pool.contains(7)
    pool.allocate(c, [], 1)
    assert events[1:] == [KvRemoved((7,))]
    pool.check()


# ----- check(): it must catch a corrupted pool, and pass a valid one -----


def shared_prefix_state() -> tuple[BlockPool, list[int], list[int]]:
    """Two requests sharing a cached two-block prefix, a third block each, one block free."""
    pool, _ = make_pool(6)
    a: list[int] = []
    b: list[int] = []
    pool.allocate(a, [], 3)
    pool.cache(a, [11, 12, 13], 0, 2)
    assert pool.allocate(b, [11, 12], 1)
    assert (a, b) == ([0, 1, 2], [0, 1, 3])
    return pool, a, b


def test_check_passes_on_every_valid_state_of_a_lifecycle() -> None:
    """Shared prefix, partial release, eviction, full release: check() holds at every step, tables given."""
    pool, a, b = shared_prefix_state()
    pool.check([a, b])
    pool.release(b)  # its private block goes free; the shared prefix is still a's
    pool.check([a])
    pool.cache(a, [11, 12, 13], 2, 3)
    pool.release(a)
    pool.check([])
    c: list[int] = []
    assert pool.allocate(c, [], 5)  # three free blocks, then two evictions from the LRU head
    pool.check([c])
    pool.release(c)
    pool.check([])
    assert pool.num_active == 0


def test_check_catches_a_block_its_owner_forgot() -> None:
    """A request that drops its table without releasing leaks a referenced block: the recount sees it."""
    pool, a, b = shared_prefix_state()
    b.clear()  # the owner forgets blocks 0, 1 (shared) and 3 without releasing them
    pool.check()  # the pool alone cannot tell: its counts are self-consistent
    with pytest.raises(AssertionError, match="block 0: 2 references recorded, 1 tables hold it"):
        pool.check([a, b])


def test_check_catches_a_block_lost_from_every_list() -> None:
    """A free block taken off the free list without being given out is neither free, inactive
    nor held by anyone: the recount against the tables sees it."""
    pool, a, b = shared_prefix_state()
    pool.release(b)  # its private block 3 goes back to the free list
    lost = pool._free.pop()
    assert lost == 3
    with pytest.raises(AssertionError, match="block 3 leaked"):
        pool.check([a])


def test_check_catches_a_held_block_on_the_free_list() -> None:
    """A block still held by a request must never be handed out again."""
    pool, a, b = shared_prefix_state()
    pool._free.append(a[2])
    with pytest.raises(AssertionError, match="block 2 is held by a table but is free"):
        pool.check([a, b])


def test_check_catches_a_referenced_hashed_block_on_the_free_list() -> None:
    """A shared block on the free list would be overwritten under its holders."""
    pool, a, _ = shared_prefix_state()
    pool._free.append(a[0])
    with pytest.raises(AssertionError, match="free block 0 still carries a hash"):
        pool.check()


def test_check_catches_a_double_release_of_a_shared_prefix() -> None:
    """Releasing b's copy twice drops the shared prefix to no references while a still lists it."""
    pool, a, b = shared_prefix_state()
    duplicate = list(b)
    pool.release(b)
    pool.release(duplicate[:2])  # the shared blocks go to the LRU under a's feet
    with pytest.raises(AssertionError, match="block 0 is held by a table but is inactive"):
        pool.check([a])


def test_check_catches_a_block_listed_twice_where_it_is_live() -> None:
    """A block listed twice in its LRU group would be evicted twice: its id handed out twice."""
    pool, a, b = shared_prefix_state()
    pool.release(b)
    pool.release(a)
    (key,) = pool._queue  # one group: blocks 0 and 1 (b's and a's third blocks went free)
    pool._groups[key].insert(0, pool._groups[key][-1])
    pool._entries += 1
    with pytest.raises(AssertionError, match="a block is live in the LRU twice"):
        pool.check()


def test_check_catches_an_inactive_block_in_no_group() -> None:
    """A block marked inactive that its group no longer lists would never be evicted nor
    taken back: its capacity lost."""
    pool, a, b = shared_prefix_state()
    pool.release(b)
    pool.release(a)
    (key,) = pool._queue
    lost = pool._groups[key].pop(0)
    pool._entries -= 1
    with pytest.raises(AssertionError, match=f"block {lost} is inactive in no group"):
        pool.check()


def test_a_prefix_hit_leaves_a_stale_entry_that_eviction_skips() -> None:
    """A hashed block taken back from the LRU by a prefix hit and released again is evicted
    from its new place: its old entry, now stale, is passed over."""
    pool, _ = make_pool(4)
    a: list[int] = []
    pool.allocate(a, [], 2)
    pool.cache(a, [11, 12], 0, 2)
    pool.release(a)  # LRU: 1, 0 (chain tail first)
    c: list[int] = []
    pool.allocate(c, [], 2)  # the two never-used ids, 2 and 3
    pool.cache(c, [21, 22], 0, 2)
    pool.release(c)  # LRU: 1, 0, 3, 2
    b: list[int] = []
    assert pool.allocate(b, [11], 0)  # block 0 taken back: its entry goes stale
    pool.release(b)  # LRU: 1, 3, 2, 0 (block 0 queued again, at the tail)
    assert pool.lru_order() == [1, 3, 2, 0]
    # Groups, oldest first, the next to go last: block 0 is still listed in the first, stale.
    assert [pool._groups[key] for key in pool._queue] == [[0, 1], [2, 3], [0]]
    pool.check()
    d: list[int] = []
    assert pool.allocate(d, [], 3)
    assert d == [1, 3, 2]  # block 0's stale entry was passed over, not evicted
    assert pool.lru_order() == [0]
    pool.check([d])


def test_eviction_passes_a_group_taken_back_whole_and_evicts_a_live_one_in_release_order() -> None:
    """A release's hashed blocks enter the LRU as one group; a prefix hit that takes all of
    them back leaves the whole group stale, and eviction passes it to the next group, whose
    blocks go chain tail first and are published in that order."""
    pool, events = make_pool(6)
    a: list[int] = []
    pool.allocate(a, [], 2)
    pool.cache(a, [11, 12], 0, 2)
    pool.release(a)  # group [0, 1]
    b: list[int] = []
    assert pool.allocate(b, [11, 12], 0)  # both taken back: the group goes stale
    pool.release(b)  # a new group [0, 1]
    c: list[int] = []
    pool.allocate(c, [], 2)
    pool.cache(c, [21, 22], 0, 2)
    pool.release(c)  # group [2, 3]
    assert [pool._groups[key] for key in pool._queue] == [[0, 1], [0, 1], [2, 3]]
    assert pool._entries == 6 and pool.num_inactive == 4
    events.clear()
    d: list[int] = []
    assert pool.allocate(d, [], 4)  # the two never-used ids, then two evictions
    assert d == [4, 5, 1, 0]
    assert events == [KvRemoved((12, 11))]
    assert [pool._groups[key] for key in pool._queue] == [[2, 3]]
    assert pool._entries == 2 and pool.lru_order() == [3, 2]
    pool.check([d])


def test_stale_entries_are_swept_once_they_outnumber_live_ones() -> None:
    """A hot prefix taken back and released thousands of times leaves an entry each time;
    the queue is rebuilt from its live entries before they pile up, order kept."""
    pool, _ = make_pool(8)
    a: list[int] = []
    pool.allocate(a, [], 3)
    pool.cache(a, [11, 12, 13], 0, 3)
    pool.release(a)  # LRU: 2, 1, 0
    for _ in range(3000):
        hot: list[int] = []
        assert pool.allocate(hot, [11, 12], 0)
        pool.release(hot)  # 1, 0 go stale at their old places and are queued again
        assert pool._entries <= 2 * pool.num_inactive + 4096 + 2
    assert pool.lru_order() == [2, 1, 0]
    pool.check()
    taken: list[int] = []
    assert pool.allocate(taken, [], 8)
    assert taken == [3, 4, 5, 6, 7, 2, 1, 0]


def test_check_catches_a_stale_hash_index_entry() -> None:
    """A hash left in the index after its block went free would be matched by a later prompt."""
    pool, a, b = shared_prefix_state()
    pool.release(b)
    pool.release(a)
    block = pool.lru_order()[0]
    assert pool._groups[pool._queue[0]].pop() == block
    pool._refs[block] = 0
    pool._entries -= 1
    pool._inactive -= 1
    pool._free.append(block)  # freed by hand, its hash still indexed
    with pytest.raises(AssertionError, match=f"free block {block} still carries a hash"):
        pool.check()


def test_computed_runs_on_the_free_list_count_inactive_until_taken() -> None:
    """A request's own computed blocks (never hashed: nobody else could match them) released
    while the LRU is empty go to the free list's tail, where the reference keeps them cached:
    telemetry counts them inactive until an allocation takes them."""
    pool = BlockPool(8)
    table: list[int] = []
    pool.allocate(table, [], 5)  # blocks 0-4, all private
    pool.release(table, 0, 3)  # 0-2 hold computed KV; 3-4 do not
    assert (pool.num_free, pool.num_inactive, pool.num_inactive_visible) == (8, 0, 3)
    fresh: list[int] = []
    pool.allocate(fresh, [], 4)  # ids 5-7 never handed out, then the free list's head (4)
    assert fresh == [5, 6, 7, 4] and pool.num_inactive_visible == 3
    pool.allocate(fresh, [], 2)  # 3, then the run's first block (2, released last first)
    assert fresh[-2:] == [3, 2] and pool.num_inactive_visible == 2
    pool.allocate(fresh, [], 2)
    assert pool.num_inactive_visible == 0 and pool.num_free == 0
