"""vLLM-style paged KV block pool of one DP rank, with prefix caching.

Each physical block is *free*, *private* (allocated, content not yet hashed),
or *cached* (carries a sequence hash and a reference count). A cached block
with no references is *inactive*: it still holds reusable KV and sits in an LRU
ordered by when it became inactive; allocation evicts from the LRU head
(oldest first) once the free list is empty. Several cached copies may carry the
same hash (two requests that computed the same block at once); each uses
capacity, and the hash stays visible until its last copy is evicted.

Invariants (checked by :meth:`check`): every block is exactly one of free
(no references, no hash), inactive (no references, a hash, in the LRU) or
active (referenced, on neither list); every cached block is listed under its
hash; and, given the block tables that hold them, each block's reference
count is the number of tables listing it.

Memory grows with the blocks a rank has used, not with its capacity: block
ids are handed out in order the first time (a counter stands for the ids
never used yet), and the per-block state is appended as each id first goes
out. A cluster of thousands of mostly idle ranks then costs little.

KV events, when a sink is attached, mirror the reference: ``Stored`` for runs
of consecutive blocks whose hash became visible (0 -> 1 copies), with the
preceding block's hash as parent; ``Removed`` when the last copy of a hash is
evicted. Nothing is emitted on release or on a prefix hit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

BlockId = int
BlockHash = int

UNNAMED: BlockHash = 1 << 64
"""Hash slot of a cached block that no other request can ever match.

Outside the u64 range of real hashes. Such a block behaves as cached (it goes
to the LRU when released, and is evicted from it) but is not in the hash
index; :meth:`BlockPool.name` gives it its real hash if its owner needs it.
Released onto an empty LRU it goes to the free list's tail instead: it would
be the next block taken after the free list either way.
"""


@dataclass(frozen=True, slots=True)
class KvStored:
    """Blocks whose hashes became visible, chained after ``parent``."""

    parent: BlockHash | None
    hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class KvRemoved:
    """Hashes no longer held by any block."""

    hashes: tuple[BlockHash, ...]


KvEvent = KvStored | KvRemoved


class BlockPool:
    """Blocks of one rank: free list, cached copies by hash, LRU of inactive blocks."""

    __slots__ = (
        "_by_hash",
        "_extra_copies",
        "_free",
        "_free_head",
        "_hash",
        "_lru",
        "_refs",
        "_used",
        "capacity",
        "events",
    )

    def __init__(self, capacity: int, *, events: list[KvEvent] | None = None) -> None:
        self.capacity = capacity
        self.events = events
        # The free list, oldest first, is the ids never handed out (_used up to
        # capacity, ascending), then the recycled blocks from _free_head on. Every
        # release appends, so the never-used ids always stay at the head: a counter
        # stands for them. (Listing all ids up front cost ~1 MB per rank.)
        # Recycled blocks are a list, so that many can be taken or returned at once
        # (a deque pops one at a time).
        self._used = 0
        self._free: list[BlockId] = []
        self._free_head = 0
        # Per-block state of the ids handed out so far (ids below _used).
        self._hash: list[BlockHash | None] = []
        self._refs: list[int] = []
        # First copy of each visible hash; further copies (rare) in _extra_copies.
        # One int per hash, not a list, keeps caching and eviction allocation-free.
        self._by_hash: dict[BlockHash, BlockId] = {}
        self._extra_copies: dict[BlockHash, list[BlockId]] = {}
        # Oldest inactive block first; O(1) removal from the middle and from the head.
        # (A plain dict would do the first, but finding its head after many deletions
        # scans the holes they leave: quadratic over a long run.)
        self._lru: OrderedDict[BlockId, None] = OrderedDict()

    # ----- counts -----

    @property
    def num_free(self) -> int:
        """Blocks holding nothing."""
        return self.capacity - self._used + len(self._free) - self._free_head

    @property
    def num_inactive(self) -> int:
        """Cached blocks nobody references (evictable)."""
        return len(self._lru)

    @property
    def num_active(self) -> int:
        """Blocks referenced by at least one request."""
        return self.capacity - self.num_free - len(self._lru)

    # ----- lookups -----

    def contains(self, block_hash: BlockHash) -> bool:
        """Whether some block holds KV with this sequence hash."""
        return block_hash in self._by_hash

    def match_prefix(self, hashes: list[BlockHash], limit: int) -> tuple[int, int]:
        """Longest resident prefix of ``hashes[:limit]``.

        A hit takes a hash's first cached copy, as the reference's does: it is
        active when that copy is referenced (another referenced copy does not
        count).

        Returns:
            (hit blocks, how many of them are active, i.e. already referenced).
        """
        by_hash, refs = self._by_hash, self._refs
        hits = active = 0
        for block_hash in hashes[:limit]:
            block = by_hash.get(block_hash)
            if block is None:
                break
            hits += 1
            if refs[block]:
                active += 1
        return hits, active

    def removals_of_oldest(self, count: int) -> list[BlockHash | None]:
        """For evicting the ``count`` oldest inactive blocks in turn: the hash each
        eviction would publish as Removed (its last copy going), or None."""
        block_hash, extra = self._hash, self._extra_copies
        gone: dict[BlockHash, int] = {}
        out: list[BlockHash | None] = []
        for block in self._lru:
            if len(out) >= count:
                break
            h = block_hash[block]
            assert h is not None
            if h == UNNAMED:
                out.append(None)
                continue
            gone[h] = gone.get(h, 0) + 1
            copies = 1 + len(extra.get(h, ()))
            out.append(h if gone[h] == copies else None)
        return out

    def lru_order(self) -> list[BlockId]:
        """Inactive blocks, next to be evicted first (for tests and diagnostics)."""
        return list(self._lru)

    # ----- mutations -----

    def allocate(self, table: list[BlockId], prefix: list[BlockHash], num_new: int) -> bool:
        """Extend a request's block table by cached ``prefix`` copies then ``num_new`` fresh blocks.

        Atomic: when the free list plus evictable blocks (excluding those this
        prefix reuses) cannot supply ``num_new`` blocks, nothing changes and
        the call returns False, so the caller can preempt and retry.
        """
        picks = [self._by_hash[h] for h in prefix]  # each hash's first cached copy
        shortfall = num_new - self.num_free
        if shortfall > 0:
            pinned_inactive = sum(1 for b in picks if b in self._lru)
            if shortfall > len(self._lru) - pinned_inactive:
                return False
        lru, refs = self._lru, self._refs
        for block in picks:
            if refs[block] == 0:
                del lru[block]
            refs[block] += 1
            table.append(block)
        if num_new <= 0:
            return True
        fresh = self._take_free(num_new - max(shortfall, 0))
        if shortfall > 0:
            # Evicted blocks join the free list's tail: the new blocks are the free ones, then them.
            fresh += self._evict_oldest(shortfall)
        for block in fresh:
            refs[block] = 1
        table.extend(fresh)
        return True

    def _take_free(self, count: int) -> list[BlockId]:
        """The ``count`` oldest free blocks: never-used ids first, then recycled ones."""
        used = self._used
        fresh = min(count, self.capacity - used)
        taken = list(range(used, used + fresh))
        if fresh:
            self._used = used + fresh
            self._hash.extend([None] * fresh)
            self._refs.extend([0] * fresh)
            count -= fresh
            if not count:
                return taken
        head = self._free_head
        taken += self._free[head : head + count]
        head += count
        if head > 4096 and head * 2 > len(self._free):
            del self._free[:head]  # compact now and then: amortised O(1) per block
            head = 0
        self._free_head = head
        return taken

    def cache(self, table: list[BlockId], hashes: list[BlockHash], start: int, end: int) -> None:
        """Make blocks ``table[start:end]`` cache-visible under ``hashes[start:end]``.

        Called when their tokens have been computed. A block that already
        carries a hash (a reused prefix copy) is left alone.
        """
        block_hash = self._hash
        by_hash = self._by_hash
        events = self.events
        if events is None:
            for block, h in zip(table[start:end], hashes[start:end], strict=True):
                if block_hash[block] is None:
                    block_hash[block] = h
                    if h in by_hash:
                        self._extra_copies.setdefault(h, []).append(block)
                    else:
                        by_hash[h] = block
            return
        run: list[BlockHash] = []
        run_parent: BlockHash | None = None
        for i in range(start, end):
            block = table[i]
            if block_hash[block] is not None:
                continue
            h = hashes[i]
            block_hash[block] = h
            if h not in by_hash:
                by_hash[h] = block
                if not run:
                    run_parent = hashes[i - 1] if i > 0 else None
                run.append(h)
                continue
            self._extra_copies.setdefault(h, []).append(block)
            if run:
                events.append(KvStored(run_parent, tuple(run)))
                run = []
        if run:
            events.append(KvStored(run_parent, tuple(run)))

    def cache_unnamed(self, table: list[BlockId], start: int, end: int) -> None:
        """Make blocks ``table[start:end]`` cached without indexing them (see :data:`UNNAMED`)."""
        block_hash = self._hash
        for block in table[start:end]:
            if block_hash[block] is None:
                block_hash[block] = UNNAMED

    def name(self, table: list[BlockId], hashes: list[BlockHash], start: int, end: int) -> None:
        """Give the unnamed blocks of ``table[start:end]`` their hashes, as if cached with them."""
        block_hash = self._hash
        for i in range(start, end):
            if block_hash[table[i]] == UNNAMED:
                block_hash[table[i]] = None
        self.cache(table, hashes, start, end)

    def release(self, table: list[BlockId], exclusive_from: int | None = None) -> None:
        """Drop a request's references, last block first (so chain tails evict first).

        Args:
            table: the request's blocks; emptied.
            exclusive_from: blocks from this index on are the request's alone
                (unnamed or private, one reference): they are released in bulk.
        """
        refs, block_hash, lru, free = self._refs, self._hash, self._lru, self._free
        start = len(table) if exclusive_from is None else min(exclusive_from, len(table))
        tail = table[start:]
        if tail:
            tail.reverse()
            for block in tail:
                refs[block] = 0
            if not lru:
                # An unnamed block at the LRU head would be the next one taken after the
                # free list, with no identity to lose: the free list's tail is the same place.
                for block in tail:
                    block_hash[block] = None
                free.extend(tail)
            else:
                for block in tail:
                    if block_hash[block] is None:
                        free.append(block)
                    else:
                        lru[block] = None
        for block in reversed(table[:start]):
            left = refs[block] - 1
            refs[block] = left
            if left:
                continue
            h = block_hash[block]
            if h is None:
                free.append(block)
            elif h == UNNAMED and not lru:
                block_hash[block] = None
                free.append(block)
            else:
                lru[block] = None
        table.clear()

    def check(self, tables: Iterable[Sequence[BlockId]] | None = None) -> None:
        """Assert the pool's invariants (tests call this after every step).

        Every block must be in exactly one state, judged block by block rather
        than from the pool's own counters: *free* (on the free list once, no
        references, no hash), *inactive* (in the LRU, no references, a hash)
        or *active* (referenced; then on neither list). A block with no
        references on neither list has leaked; a referenced block on the free
        list would be handed to a second request. The hash index lists
        exactly the blocks carrying a real hash.

        Args:
            tables: when given, every block table that holds references on
                this pool (running, waiting-with-blocks, held and reserved
                requests). Each block's reference count must then equal the
                number of tables listing it: a count the pool kept after its
                owner forgot the block (a leak), or lost while a table still
                lists it (a double release), fails here.

        Blocks never handed out (ids from the counter on) are free by
        construction: they must appear nowhere, not on the recycled list, in
        the LRU, the hash index or a table.

        Costs O(blocks used + blocks in tables); the hot path keeps no extra state.
        """
        used, refs, block_hash, lru = self._used, self._refs, self._hash, self._lru
        assert 0 <= used <= self.capacity, f"{used} blocks handed out of {self.capacity}"
        assert len(refs) == len(block_hash) == used, "per-block state does not match the ids used"
        free = self._free[self._free_head :]
        free_set = set(free)
        assert len(free_set) == len(free), "a block is on the free list twice"
        assert all(0 <= b < used for b in free_set), (
            "a free-list entry is not a block id handed out"
        )
        assert all(0 <= b < used for b in lru), "an LRU entry is not a block id handed out"
        active = 0
        for block in range(used):
            count = refs[block]
            assert count >= 0, f"block {block} has {count} references"
            on_free, on_lru = block in free_set, block in lru
            if count:
                active += 1
                assert not on_free, f"block {block} has {count} references but is on the free list"
                assert not on_lru, f"block {block} has {count} references but is in the LRU"
                continue
            assert not (on_free and on_lru), f"block {block} is both free and inactive"
            assert on_free or on_lru, (
                f"block {block} leaked: no references, neither free nor evictable"
            )
            if on_free:
                assert block_hash[block] is None, f"free block {block} still carries a hash"
            else:
                assert block_hash[block] is not None, f"inactive block {block} has no hash"
        assert active == self.num_active, "free + inactive + active blocks != capacity"
        indexed = list(self._by_hash.values())
        for copies in self._extra_copies.values():
            indexed += copies
        assert all(0 <= b < used for b in indexed), "the hash index lists a block never handed out"
        for h, block in self._by_hash.items():
            assert block_hash[block] == h, f"hash index points {h} at block {block}"
        for h, copies in self._extra_copies.items():
            assert copies and h in self._by_hash, "extra copies without a first copy"
            for block in copies:
                assert block_hash[block] == h, f"extra copy {block} of {h} carries another hash"
        named = [b for b in range(used) if block_hash[b] not in (None, UNNAMED)]
        assert len(set(indexed)) == len(indexed), "a block is indexed twice"
        assert set(indexed) == set(named), "hash index and block hashes disagree"
        if tables is None:
            return
        counted = [0] * used
        for table in tables:
            assert len(set(table)) == len(table), f"a block table lists a block twice: {table}"
            for block in table:
                assert 0 <= block < used, f"a block table lists block {block}, never handed out"
                counted[block] += 1
        for block in range(used):
            assert refs[block] == counted[block], (
                f"block {block}: {refs[block]} references recorded, {counted[block]} tables hold it"
            )

    # ----- internals -----

    def _evict_oldest(self, count: int) -> list[BlockId]:
        """Evict ``count`` inactive blocks, oldest first; return their ids in that order.

        Hashes whose last copy goes are published as one Removed event.
        """
        popitem, block_hash, by_hash = self._lru.popitem, self._hash, self._by_hash
        extra = self._extra_copies
        evicted = []
        removed = []
        for _ in range(count):
            block = popitem(last=False)[0]
            h = block_hash[block]
            assert h is not None
            block_hash[block] = None
            evicted.append(block)
            if h == UNNAMED:
                continue
            if extra and h in extra:
                self._forget_copy(h, block)
                continue
            del by_hash[h]
            removed.append(h)
        if removed and self.events is not None:
            self.events.append(KvRemoved(tuple(removed)))
        return evicted

    def _forget_copy(self, h: BlockHash, block: BlockId) -> None:
        """Drop one of several copies of ``h``; the hash stays visible."""
        copies = self._extra_copies[h]
        if self._by_hash[h] == block:
            self._by_hash[h] = copies.pop(0)
        else:
            copies.remove(block)
        if not copies:
            del self._extra_copies[h]
