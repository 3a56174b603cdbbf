"""Narrative tests of the vLLM block pool: block ids, LRU eviction order, KV events."""

from __future__ import annotations

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
