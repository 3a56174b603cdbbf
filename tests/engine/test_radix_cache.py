"""Narrative and property tests of the SGLang radix cache: page ids, splits, locks, eviction, events.

Hashes in these tests are small integers standing for local page hashes; a
page's published (sequence) hash chains them with ``hashing.chain``.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.engine.kv.block_pool import KvEvent, KvRemoved, KvStored
from servesim.engine.kv.hashing import chain
from servesim.engine.kv.radix_cache import (
    PagePool,
    RadixCache,
    RadixKvManager,
    RadixLease,
    TreeNode,
)


def make_manager(total_pages: int, page_size: int = 1) -> tuple[RadixKvManager, list[KvEvent]]:
    events: list[KvEvent] = []
    return RadixKvManager(total_pages, page_size, events=events), events


def insert_fresh(cache: RadixCache, hashes: list[int], pages: list[int]) -> TreeNode:
    """Insert a whole sequence from the root, as a finished request's pages."""
    return cache.insert(cache.root, hashes, pages, 0, len(hashes))


def seq_hashes(*local: int) -> tuple[int, ...]:
    """Published hashes of consecutive pages from the root."""
    out: list[int] = []
    parent: int | None = None
    for h in local:
        parent = chain(parent, h)
        out.append(parent)
    return tuple(out)


# ----- page pool -----


def test_pool_hands_out_fresh_ids_then_reuses_the_last_freed_first() -> None:
    """Fresh ids 0, 1, 2 first; freed pages come back last-freed-first, ahead of fresh ids."""
    pool = PagePool(6, 4)
    assert pool.allocate(3) == [0, 1, 2]
    pool.free([2, 0])
    pool.free([1])
    assert pool.available_tokens == 6 * 4
    assert pool.allocate(2) == [0, 1]  # the tail of the free list, in its order
    assert pool.allocate(3) == [2, 3, 4]  # the rest of the free list, then fresh ids
    assert pool.allocate(2) is None  # one page left: refusing takes nothing
    assert pool.num_free_pages == 1


# ----- tree: split, locks, eviction -----


def test_partial_match_splits_the_edge_and_the_prefix_keeps_lock_and_time() -> None:
    """A match ending inside an edge splits it; the new prefix node inherits lock and access time."""
    cache = RadixCache(16, 1)
    leaf = insert_fresh(cache, [1, 2, 3, 4, 5], cache.pool.allocate(5) or [])
    cache.inc_lock_ref(leaf)
    born = leaf.last_access

    matched, node = cache.match_prefix([1, 2, 3, 9])

    assert matched == 3
    assert (node.key, node.value) == ([1, 2, 3], [0, 1, 2])
    assert (leaf.key, leaf.value) == ([4, 5], [3, 4])
    assert node.children == {4: leaf} and leaf.parent is node and node.parent is cache.root
    assert node.lock_ref == leaf.lock_ref == 1
    assert node.last_access == leaf.last_access == born  # a partial match touches nothing
    assert (cache.protected_size, cache.evictable_size) == (5, 0)
    assert cache.prefix_match_len([1, 2, 3, 4, 5, 6]) == 5
    cache.check()


def test_read_only_match_neither_splits_nor_touches() -> None:
    """The LPM scoring match changes nothing in the tree."""
    cache = RadixCache(8, 2)
    leaf = insert_fresh(cache, [1, 2, 3], cache.pool.allocate(3) or [])
    stamp = leaf.last_access
    assert cache.prefix_match_len([1, 2, 7]) == 4  # two pages of two tokens
    assert cache.prefix_match_len([1, 2, 3], 1) == 2  # limited to the first page
    assert cache.root.children == {1: leaf} and leaf.key == [1, 2, 3]
    assert leaf.last_access == stamp


def test_locks_walk_to_the_root_and_move_tokens_between_sizes() -> None:
    """Locking two branches protects the shared prefix once; unlocking returns tokens to evictable."""
    cache = RadixCache(16, 1)
    a = insert_fresh(cache, [1, 2, 3, 4, 5], cache.pool.allocate(5) or [])
    b = cache.insert(cache.root, [1, 2, 3, 6, 7], [0, 1, 2, *(cache.pool.allocate(2) or [])], 0, 5)
    shared = a.parent
    assert shared is not None and shared is b.parent and shared.value == [0, 1, 2]
    assert (a.value, b.value) == ([3, 4], [5, 6])

    cache.inc_lock_ref(a)
    cache.inc_lock_ref(b)
    assert (shared.lock_ref, a.lock_ref, b.lock_ref) == (2, 1, 1)
    assert (cache.protected_size, cache.evictable_size) == (7, 0)
    assert cache.lru_leaves() == []

    cache.dec_lock_ref(a)
    assert (shared.lock_ref, a.lock_ref) == (1, 0)
    assert (cache.protected_size, cache.evictable_size) == (5, 2)
    assert cache.lru_leaves() == [a]

    cache.dec_lock_ref(b)
    assert (cache.protected_size, cache.evictable_size) == (0, 7)
    assert cache.lru_leaves() == [a, b]  # both keep their insertion times
    cache.check()


def test_eviction_takes_the_least_recently_used_leaf_first() -> None:
    """Touching an older leaf by a match makes the other one the victim."""
    cache = RadixCache(8, 1)
    insert_fresh(cache, [1, 2], cache.pool.allocate(2) or [])
    insert_fresh(cache, [3, 4], cache.pool.allocate(2) or [])
    cache.match_prefix([1, 2])

    assert cache.evict(2) == [2, 3]
    assert cache.prefix_match_len([3, 4]) == 0 and cache.prefix_match_len([1, 2]) == 2
    assert cache.pool.free_list() == [2, 3]
    assert (cache.evictable_size, cache.protected_size) == (2, 0)
    cache.check()


def test_a_parent_left_childless_becomes_an_evictable_leaf_with_its_own_age() -> None:
    """Evicting both branches exposes their (older) parent before a newer sibling tree."""
    cache = RadixCache(8, 1)
    insert_fresh(cache, [10, 11, 12], cache.pool.allocate(3) or [])  # pages 0 1 2
    cache.insert(cache.root, [10, 11, 13], [0, 1, *(cache.pool.allocate(1) or [])], 0, 3)
    insert_fresh(cache, [20, 21], cache.pool.allocate(2) or [])  # pages 4 5

    assert cache.evict(2) == [2, 3]  # leaves [12] then [13]
    assert [n.key for n in cache.lru_leaves()] == [[10, 11], [20, 21]]
    assert cache.evict(2) == [0, 1]  # the parent keeps the first insertion's time
    assert cache.prefix_match_len([20, 21]) == 2
    cache.check()


def test_eviction_trims_the_newest_pages_of_a_long_leaf() -> None:
    """Needing 3 tokens of a 4-page leaf (2 tokens a page) drops its last 2 pages only."""
    cache = RadixCache(8, 2)
    leaf = insert_fresh(cache, [1, 2, 3, 4], cache.pool.allocate(4) or [])
    insert_fresh(cache, [5], cache.pool.allocate(1) or [])

    assert cache.evict(3) == [2, 3]
    assert (leaf.key, leaf.value) == ([1, 2], [0, 1])
    assert cache.evictable_size == 6
    assert cache.lru_leaves()[0] is leaf  # still evictable, still the oldest
    assert cache.evict(5) == [0, 1, 4]
    assert cache.root.children == {} and cache.evictable_size == 0
    assert cache.pool.free_list() == [2, 3, 0, 1, 4]
    cache.check()


def test_eviction_skips_locked_paths_and_stops_when_nothing_is_left() -> None:
    """Only unlocked leaves go; asking for more than is evictable frees what there is."""
    cache = RadixCache(8, 1)
    kept = insert_fresh(cache, [1, 2, 3], cache.pool.allocate(3) or [])
    insert_fresh(cache, [4, 5, 6], cache.pool.allocate(3) or [])
    cache.inc_lock_ref(kept)
    assert cache.evict(6) == [3, 4, 5]
    assert cache.prefix_match_len([1, 2, 3]) == 3
    cache.check()


# ----- manager: leases, canonical pages, events -----


def test_allocation_reuses_the_cached_prefix_and_takes_fresh_pages_for_the_rest() -> None:
    """A finished request's pages are the next one's prefix; only the suffix is new."""
    mgr, _ = make_manager(100)
    first = RadixLease([1, 2, 3, 4, 5])
    assert mgr.allocate(first, 5) == 0
    mgr.finish(first, 5)

    second = RadixLease([1, 2, 3, 4, 5, 6, 7])
    assert mgr.allocate(second, 7) == 5
    assert second.pages == [0, 1, 2, 3, 4, 5, 6]
    assert (second.cached_tokens, second.num_tokens) == (5, 7)
    assert mgr.available_tokens == 93
    assert (mgr.protected_tokens, mgr.evictable_tokens) == (5, 0)
    mgr.check([first, second])


def test_match_limit_keeps_the_last_prompt_token_computed() -> None:
    """With the match capped below the prompt, a fully cached prompt still owns its last page."""
    mgr, _ = make_manager(8)
    first = RadixLease([1, 2, 3])
    mgr.allocate(first, 3)
    mgr.finish(first, 3)
    again = RadixLease([1, 2, 3])
    limit = mgr.prefix_match_len(again.page_hashes, 2)
    assert limit == 2
    assert mgr.allocate(again, 3, match_limit=limit) == 2
    assert again.pages == [0, 1, 3]
    mgr.check([first, again])


def test_allocation_locks_its_prefix_before_evicting_for_the_rest() -> None:
    """The matched prefix is protected first, so eviction trims another leaf instead."""
    mgr, _ = make_manager(3, 4)
    prefix = RadixLease([1])
    mgr.allocate(prefix, 4)
    mgr.finish(prefix, 4)  # page 0
    other = RadixLease([9, 10])
    mgr.allocate(other, 8)
    mgr.finish(other, 8)  # pages 1 2
    mgr.cache.match_prefix([9, 10])  # make the prefix the least recently used leaf
    assert mgr.available_tokens == 0

    extended = RadixLease([1, 5])
    assert mgr.allocate(extended, 8) == 4
    assert extended.pages == [0, 2]  # the newest page of [9 10] was evicted and reused
    assert mgr.prefix_match_len([1]) == 4 and mgr.prefix_match_len([9, 10]) == 4
    mgr.check([prefix, other, extended])


def test_allocation_that_cannot_fit_changes_no_page_and_releases_its_lock() -> None:
    """Free plus evictable pages short of the need: None, and the prefix stays evictable."""
    mgr, _ = make_manager(4)
    first = RadixLease([1, 2])
    mgr.allocate(first, 2)
    mgr.finish(first, 2)
    blocker = RadixLease([7, 8])
    mgr.allocate(blocker, 2)

    big = RadixLease([1, 2, 3, 4, 5])
    assert mgr.allocate(big, 5) is None
    assert not big.active and big.pages == []
    assert (mgr.available_tokens, mgr.evictable_tokens, mgr.protected_tokens) == (0, 2, 0)
    mgr.check([first, blocker, big])


def test_duplicate_pages_switch_to_the_canonical_copy_and_are_freed() -> None:
    """Two requests computed the same prompt; the second to insert adopts the first's pages."""
    mgr, events = make_manager(8)
    a, b = RadixLease([1, 2, 3]), RadixLease([1, 2, 3])
    assert mgr.allocate(a, 3) == 0 and mgr.allocate(b, 3) == 0
    assert (a.pages, b.pages) == ([0, 1, 2], [3, 4, 5])
    mgr.cache_prefix(a, 3)
    mgr.cache_prefix(b, 3)

    assert b.pages == [0, 1, 2] and b.last_node is a.last_node
    assert a.last_node is not None and a.last_node.lock_ref == 2
    assert mgr.cache.pool.free_list() == [3, 4, 5]
    assert events == [KvStored(None, seq_hashes(1, 2, 3))]  # the duplicates never showed
    mgr.check([a, b])

    # Recycled pages go out last-freed-first, before ids never used.
    c, d = RadixLease([7, 8]), RadixLease([9, 10])
    mgr.allocate(c, 2)
    mgr.allocate(d, 2)
    assert (c.pages, d.pages) == ([4, 5], [3, 6])
    mgr.check([a, b, c, d])


def test_finishing_a_duplicate_frees_its_copies_and_keeps_the_tree_pages() -> None:
    """A finished request whose pages another request cached first adds only its own tail.

    The tail extends the (unlocked) leaf in place rather than hanging a child on it.
    """
    mgr, events = make_manager(8)
    a, b = RadixLease([1, 2, 3]), RadixLease([1, 2, 3, 4])
    mgr.allocate(a, 3)
    mgr.allocate(b, 4)  # pages 3 4 5 6
    mgr.finish(a, 3)
    mgr.finish(b, 4)

    assert mgr.cache.pool.free_list() == [3, 4, 5]
    leaf = mgr.cache.root.children[1]
    assert (leaf.key, leaf.value, leaf.children) == ([1, 2, 3, 4], [0, 1, 2, 6], {})
    assert events == [
        KvStored(None, seq_hashes(1, 2, 3)),
        KvStored(seq_hashes(1, 2, 3)[-1], seq_hashes(1, 2, 3, 4)[-1:]),
    ]
    mgr.check([a, b])


def test_stored_and_removed_events_follow_page_life() -> None:
    """Stored on allocation (chained from the prefix), Removed on free and on eviction."""
    mgr, events = make_manager(4)
    s1, s2, s3 = seq_hashes(10, 11, 12)
    a = RadixLease([10, 11, 12])
    mgr.allocate(a, 3)
    mgr.finish(a, 3)
    b = RadixLease([10, 20])
    assert mgr.allocate(b, 2) == 1
    assert b.pages == [0, 3]
    assert mgr.retract(b)
    c = RadixLease([30, 31, 32, 33])
    assert mgr.allocate(c, 4) == 0
    assert c.pages == [3, 1, 2, 0]

    assert events == [
        KvStored(None, (s1, s2, s3)),
        KvStored(s1, (chain(s1, 20),)),
        KvRemoved((chain(s1, 20),)),
        KvRemoved((s2, s3, s1)),  # leaf [11 12] first, then its parent [10]
        KvStored(None, seq_hashes(30, 31, 32, 33)),
    ]
    mgr.check([a, b, c])


def test_removed_waits_for_the_last_page_advertising_a_hash() -> None:
    """Two private copies of one prompt: freeing the first publishes nothing."""
    mgr, events = make_manager(8)
    a, b = RadixLease([1, 2]), RadixLease([1, 2])
    mgr.allocate(a, 2)
    mgr.allocate(b, 2)
    del events[:]
    assert mgr.retract(a)
    assert events == []
    assert mgr.retract(b)
    assert events == [KvRemoved(seq_hashes(1, 2))]
    mgr.check([a, b])


def test_partial_pages_are_never_published() -> None:
    """Only complete pages appear in Stored; a chunk completing one publishes it then."""
    mgr, events = make_manager(8, 4)
    lease = RadixLease([5, 6])
    mgr.allocate(lease, 6)  # one complete page, one partial
    assert events == [KvStored(None, (5,))]
    assert mgr.extend(lease, 8) == 6
    assert lease.pages == [0, 1]  # the partial page is filled in place
    assert events[-1] == KvStored(5, (chain(5, 6),))
    mgr.check([lease])


def test_retraction_frees_the_uncached_suffix_and_keeps_the_prefix_evictable() -> None:
    """A retracted request leaves its inserted pages in the tree, unlocked."""
    mgr, _ = make_manager(4, 4)
    lease = RadixLease([1, 2])
    mgr.allocate(lease, 4)
    mgr.cache_prefix(lease, 4)
    assert mgr.extend(lease, 6) == 4
    assert (lease.cached_tokens, lease.num_tokens, lease.pages) == (4, 6, [0, 1])

    assert mgr.retract(lease)
    assert not lease.active and lease.page_hashes == [1, 2]
    assert (mgr.available_tokens, mgr.protected_tokens, mgr.evictable_tokens) == (12, 0, 4)
    assert mgr.prefix_match_len([1, 2]) == 4
    assert not mgr.retract(lease)  # already released
    mgr.check([lease])


def test_chunk_insertion_extends_the_requests_own_locked_tail_in_place() -> None:
    """Inserting the next chunk grows the lease's leaf; a second request's match then splits it."""
    mgr, _ = make_manager(4, 4)
    first = RadixLease([1, 2])
    mgr.allocate(first, 4)
    mgr.cache_prefix(first, 4)
    tail = first.last_node
    mgr.extend(first, 8)
    mgr.cache_prefix(first, 8)
    assert first.last_node is tail and tail is not None and tail.key == [1, 2]
    assert mgr.protected_tokens == 8

    second = RadixLease([1, 9])
    assert mgr.allocate(second, 8) == 4
    shared = second.last_node
    assert shared is not None and shared.key == [1] and tail.parent is shared
    assert (shared.lock_ref, tail.lock_ref) == (2, 1)
    mgr.cache_prefix(second, 8)
    mgr.finish(first, 8)
    assert mgr.retract(second)
    assert (mgr.protected_tokens, mgr.evictable_tokens) == (0, 12)
    assert mgr.evict(12) == 12
    assert mgr.available_tokens == 16 and mgr.cache.root.children == {}
    mgr.check([first, second])


def test_decode_growth_takes_reserved_pages_at_boundaries_and_finish_drops_the_tail() -> None:
    """Decode tokens fill the partial page, then take a reserved page; unused ones go back."""
    mgr, _ = make_manager(8, 2)
    lease = RadixLease([1])
    mgr.allocate(lease, 3)
    assert lease.pages == [0, 1]
    reservation = mgr.reserve_decode_pages(2)
    assert reservation is not None and reservation.pages == [2, 3]

    mgr.extend_decode(lease, reservation)  # token 4 fills page 1
    lease.page_hashes.append(2)
    mgr.cache_prefix(lease, 4)
    mgr.extend_decode(lease, reservation)  # token 5 starts page 2
    assert (lease.num_tokens, lease.pages, len(reservation)) == (5, [0, 1, 2], 1)
    mgr.release_decode_reservation(reservation)
    assert mgr.cache.pool.free_list() == [3]
    mgr.check([lease], [reservation])

    mgr.finish(lease, 5)
    assert mgr.cache.pool.free_list() == [3, 2]
    assert (mgr.evictable_tokens, mgr.protected_tokens) == (4, 0)
    mgr.check([lease])


def test_a_decode_burst_takes_one_page_per_boundary_it_crosses() -> None:
    """Three tokens from 3 to 6 (pages of 2) fill page 1, then start and fill one new page."""
    mgr, _ = make_manager(8, 2)
    lease = RadixLease([1])
    mgr.allocate(lease, 3)
    reservation = mgr.reserve_decode_pages(2)
    assert reservation is not None
    mgr.extend_decode(lease, reservation, 3)
    assert (lease.num_tokens, lease.pages, len(reservation)) == (6, [0, 1, 2], 1)
    mgr.extend_decode(lease, reservation, 1)
    assert (lease.num_tokens, lease.pages, len(reservation)) == (7, [0, 1, 2, 3], 0)
    mgr.check([lease], [reservation])


def test_destination_reservation_reuses_the_cached_prefix_and_activates_as_cached() -> None:
    """A P/D destination locks its resident prefix and reserves pages for the transferred rest."""
    mgr, events = make_manager(16, 4)
    prefix = RadixLease([1])
    mgr.allocate(prefix, 4)
    mgr.finish(prefix, 4)
    prompt = RadixLease([1, 2])

    cancelled = mgr.reserve_destination(prompt.page_hashes, 10)
    assert cancelled is not None and cancelled.transferable_prompt_tokens == 8
    mgr.cancel_destination(cancelled)
    reservation = mgr.reserve_destination(prompt.page_hashes, 10)
    assert reservation is not None and reservation.fresh_pages == [1, 2]
    mgr.check([prefix, prompt], [reservation])

    assert mgr.activate_destination(reservation, prompt, 10) == 4
    assert (prompt.pages, prompt.cached_tokens, prompt.num_tokens) == ([0, 1, 2], 8, 10)
    assert events[-1] == KvStored(1, (chain(1, 2),))
    mgr.check([prefix, prompt])


# ----- properties -----

_PAGE_SIZES = st.sampled_from([1, 2, 3])
_SEQUENCE = st.lists(st.integers(1, 3), min_size=1, max_size=6)


def _assert_conserved(mgr: RadixKvManager, leases: list[RadixLease]) -> None:
    cache = mgr.cache
    in_tree = sum(len(n.value) for n in cache.nodes())
    private = sum(len(x.pages) - x.cached_tokens // mgr.page_size for x in leases if x.active)
    assert cache.pool.num_free_pages + in_tree + private == cache.pool.total_pages
    assert all(n.lock_ref >= 0 for n in cache.nodes())
    mgr.check(leases)


@settings(max_examples=150, deadline=None)
@given(page_size=_PAGE_SIZES, data=st.data())
def test_tree_operations_keep_every_invariant(page_size: int, data: st.DataObject) -> None:
    """Random match/lock/insert/evict/unlock steps: pages conserved, locks consistent."""
    cache = RadixCache(12, page_size)
    locks: list[TreeNode] = []
    for _ in range(data.draw(st.integers(1, 30))):
        op = data.draw(st.sampled_from(["match", "insert", "evict", "unlock"]))
        hashes = data.draw(_SEQUENCE)
        if op == "match":
            lock = data.draw(st.booleans())
            _, node = cache.match_prefix(hashes, lock=lock)
            if lock and node is not cache.root:
                locks.append(node)
        elif op == "insert":
            _insert_and_free_duplicates(cache, hashes)
        elif op == "evict":
            cache.evict(data.draw(st.integers(0, 12 * page_size)))
        elif locks:
            cache.dec_lock_ref(locks.pop(data.draw(st.integers(0, len(locks) - 1))))
        cache.check()
        _assert_locks_match(cache, locks)
        in_tree = sum(len(n.value) for n in cache.nodes())
        assert cache.pool.num_free_pages + in_tree == cache.pool.total_pages


def _insert_and_free_duplicates(cache: RadixCache, hashes: list[int]) -> None:
    """Insert a sequence on fresh pages (as a finished request would) and free what was not kept."""
    known = cache.prefix_match_len(hashes) // cache.page_size
    fresh = cache.pool.allocate(len(hashes) - known)
    if fresh is None:
        return
    _, node = cache.match_prefix(hashes, known, lock=True)
    pages = cache.path_pages(node, known) + fresh
    tail = cache.insert(node, hashes, pages, known, len(hashes))
    kept = cache.path_pages(tail, len(hashes))
    cache.pool.free([p for p, k in zip(pages, kept, strict=True) if p != k])
    cache.dec_lock_ref(node)


def _assert_locks_match(cache: RadixCache, locks: list[TreeNode]) -> None:
    """A node's lock count is the locks held at it or below it."""
    expected: dict[int, int] = {}
    for node in locks:
        walk: TreeNode | None = node
        while walk is not None and walk is not cache.root:
            expected[id(walk)] = expected.get(id(walk), 0) + 1
            walk = walk.parent
    for node in cache.nodes():
        if node is not cache.root:
            assert node.lock_ref == expected.get(id(node), 0), node


@settings(max_examples=150, deadline=None)
@given(page_size=_PAGE_SIZES, data=st.data())
def test_request_lifecycles_keep_every_invariant(page_size: int, data: st.DataObject) -> None:
    """Random admissions, chunks, decode tokens, finishes, retractions and evictions."""
    mgr, _ = make_manager(10, page_size)
    leases: list[RadixLease] = []
    lengths: list[int] = []  # sequence length of each lease's request
    for _ in range(data.draw(st.integers(1, 30))):
        op = data.draw(st.sampled_from(["admit", "chunk", "decode", "finish", "retract", "evict"]))
        if op == "admit":
            prompt = data.draw(_SEQUENCE)
            length = len(prompt) * page_size - data.draw(st.integers(0, page_size - 1))
            leases.append(RadixLease(prompt[: length // page_size]))
            lengths.append(length)
        elif op == "evict":
            mgr.evict(data.draw(st.integers(0, 10 * page_size)))
        elif leases:
            i = data.draw(st.integers(0, len(leases) - 1))
            lengths[i] = _step(mgr, leases[i], lengths[i], op, data)
        _assert_conserved(mgr, leases)


def _step(mgr: RadixKvManager, lease: RadixLease, length: int, op: str, data: st.DataObject) -> int:
    """Apply one operation to one request; return its new sequence length."""
    ps = mgr.page_size
    if op == "chunk" and not lease.active:
        cached = mgr.prefix_match_len(lease.page_hashes, (length - 1) // ps)
        end = min(length, cached + data.draw(st.integers(1, 2 * ps)))
        mgr.allocate(lease, end, match_limit=cached)
    elif op == "chunk" and lease.num_tokens < length:
        end = min(length, lease.num_tokens + data.draw(st.integers(1, 2 * ps)))
        if mgr.extend(lease, end) is not None and data.draw(st.booleans()):
            mgr.cache_prefix(lease, end)
    elif op == "decode" and lease.active and lease.num_tokens == length:
        return length + _decode_one(mgr, lease, length)
    elif op == "finish":
        mgr.finish(lease, length)
    elif op == "retract":
        mgr.retract(lease)
    return length


def _decode_one(mgr: RadixKvManager, lease: RadixLease, length: int) -> int:
    """One decode token, as the scheduler's step does it: evict, reserve, grow, cache."""
    ps = mgr.page_size
    need = 1 if length % ps == 0 else 0
    if need and mgr.available_tokens < ps:
        mgr.evict(ps - mgr.available_tokens)
    reservation = mgr.reserve_decode_pages(need)
    if reservation is None:
        return 0
    mgr.extend_decode(lease, reservation)
    if (length + 1) % ps == 0:
        lease.page_hashes.append(100 + length)  # a generated page: unique content
    mgr.cache_prefix(lease, length + 1)
    mgr.release_decode_reservation(reservation)
    return 1
