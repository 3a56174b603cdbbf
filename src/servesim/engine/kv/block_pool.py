"""vLLM-style paged KV block pool of one DP rank, with prefix caching.

Each physical block is *free*, *private* (allocated, content not yet hashed),
or *cached* (carries a sequence hash and a reference count). A cached block
with no references is *inactive*: it still holds reusable KV and sits in an LRU
ordered by when it became inactive; allocation evicts from the LRU head
(oldest first) once the free list is empty.

A request's blocks past its shared prefix (see ``exclusive_from`` in
:meth:`BlockPool.release`) are its alone and no other request can ever match
them: they carry no hash and no reference count. Released, the computed ones
enter the LRU as one *run* (a single entry holding their ids), evicted as a
whole or in part, and the rest go back to the free list; no per-block work is
done for them beyond moving their ids in bulk.

The LRU is a queue of *groups*, oldest first: a run, or the hashed blocks one
release made inactive (their ids, the next to go last). A hashed block's
reference count is negative while it is inactive: the key of its group, so a
prefix hit that takes it back (its count then positive) leaves its place in the
group behind, stale, and so does a later release (a newer group's key). An
entry is live only while the block's count is its group's key
(:meth:`_live`); eviction passes stale entries as it meets them, and a
group's tail that is all stale or all live at once. A release whose blocks all
go to the LRU costs one store per block. (An ordered dict of blocks, removing
from the middle, cost three times as much per block released and evicted; a
queue of single blocks, with a count of each block's entries, twice as much
per block released.) Stale entries are dropped in one sweep once they
outnumber live ones.

Per-block state grows with the block ids handed out, not with the capacity:
never-used ids come from a counter, before ids that were used and freed. Several cached copies may carry the
same hash (two requests that computed the same block at once); each uses
capacity, and the hash stays visible until its last copy is evicted.

Invariants (checked by :meth:`check`): every block is exactly one of free
(no hash), inactive (in the LRU: a hashed block with no references, or in a
run) or active (on neither list); every hashed block is listed under its hash;
an unhashed block has no references; and, given the block tables that hold
them, each hashed block's reference count is the number of tables listing
it, and every other active block is listed by exactly one table.

KV events, when a sink is attached, mirror the reference: ``Stored`` for runs
of consecutive blocks whose hash became visible (0 -> 1 copies), with the
preceding block's hash as parent; ``Removed`` when the last copy of a hash is
evicted. Nothing is emitted on release or on a prefix hit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter as _getter

BlockId = int
BlockHash = int


@dataclass(slots=True)  # not frozen: several a pass, and a frozen init costs 3.7x
class KvStored:
    """Blocks whose hashes became visible, chained after ``parent``.

    ``host``: held by the rank's host tier (a copy stored from the GPU), not its GPU.
    """

    parent: BlockHash | None
    hashes: tuple[BlockHash, ...]
    host: bool = False


@dataclass(slots=True)  # not frozen (see KvStored)
class KvRemoved:
    """Hashes no longer held by any block (of the host tier, with ``host``)."""

    hashes: tuple[BlockHash, ...]
    host: bool = False


KvEvent = KvStored | KvRemoved


class BlockPool:
    """Blocks of one rank: free list, cached copies by hash, LRU of inactive blocks and runs."""

    __slots__ = (
        "_by_hash",
        "_cached_free",
        "_compacted",
        "_entries",
        "_extra_copies",
        "_free",
        "_free_head",
        "_groups",
        "_hash",
        "_inactive",
        "_next_id",
        "_next_run",
        "_queue",
        "_refs",
        "_runs",
        "capacity",
        "events",
    )

    def __init__(self, capacity: int, *, events: list[KvEvent] | None = None) -> None:
        self.capacity = capacity
        self.events = events
        # Ids never handed out are _next_id.._capacity (taken first, in order); freed ids
        # wait in _free from _free_head on, oldest first. A list, so that many can be
        # taken or returned at once.
        self._next_id = 0
        self._free: list[BlockId] = []
        self._free_head = 0
        # Per-block state, for ids handed out so far: _refs counts a hashed block's holders,
        # is its LRU group's key (< 0) while it is inactive, and is always 0 for an
        # unhashed one (which is how release tells it).
        self._hash: list[BlockHash | None] = []
        self._refs: list[int] = []
        # First copy of each visible hash; further copies (rare) in _extra_copies.
        # One int per hash, not a list, keeps caching and eviction allocation-free.
        self._by_hash: dict[BlockHash, BlockId] = {}
        self._extra_copies: dict[BlockHash, list[BlockId]] = {}
        # Oldest first, keys < 0: a run of a request's own blocks (in _runs) or the hashed
        # blocks a release made inactive (in _groups), their ids with the next to go last,
        # so that taking part of one costs what it takes. _inactive counts the live
        # blocks, _entries the ids the groups hold (live or stale).
        self._queue: deque[int] = deque()
        self._runs: dict[int, list[BlockId]] = {}
        self._groups: dict[int, list[BlockId]] = {}
        self._inactive = 0
        self._entries = 0
        self._next_run = -1
        # Computed runs that went to the free list's tail (see release): cached blocks
        # to the reference, which counts them inactive until taken. Absolute free-list
        # positions [start, end); _compacted counts the entries dropped from _free's front.
        self._cached_free: deque[tuple[int, int]] = deque()
        self._compacted = 0

    # ----- counts -----

    @property
    def num_free(self) -> int:
        """Blocks holding nothing."""
        return len(self._free) - self._free_head + self.capacity - self._next_id

    @property
    def num_inactive(self) -> int:
        """Cached blocks nobody references (evictable)."""
        return self._inactive

    @property
    def num_inactive_visible(self) -> int:
        """Inactive blocks as the reference counts them: evictable ones, and computed runs
        waiting at the free list's tail (which it caches and servesim need not)."""
        head = self._compacted + self._free_head
        runs = self._cached_free
        while runs and runs[0][1] <= head:
            runs.popleft()
        return self._inactive + sum(end - max(start, head) for start, end in runs)

    @property
    def num_active(self) -> int:
        """Blocks held by at least one request."""
        return self.capacity - self.num_free - self._inactive

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
        active = 0
        # (islice, not a copy: the walk stops at a miss)
        for hits, block_hash in enumerate(islice(hashes, limit)):
            block = by_hash.get(block_hash)
            if block is None:
                return hits, active
            if refs[block] > 0:
                active += 1
        return (len(hashes) if len(hashes) < limit else limit), active

    def removals_of_oldest(self, count: int) -> list[BlockHash | None]:
        """For evicting the ``count`` oldest inactive blocks in turn: the hash each
        eviction would publish as Removed (its last copy going), or None."""
        block_hash, extra, refs = self._hash, self._extra_copies, self._refs
        runs, groups = self._runs, self._groups
        gone: dict[BlockHash, int] = {}
        out: list[BlockHash | None] = []
        for key in self._queue:
            if len(out) >= count:
                break
            run = runs.get(key)
            if run is not None:
                out += [None] * min(len(run), count - len(out))
                continue
            for block in reversed(groups[key]):
                if refs[block] != key:
                    continue  # stale
                if len(out) >= count:
                    break
                h = block_hash[block]
                assert h is not None
                gone[h] = gone.get(h, 0) + 1
                copies = 1 + len(extra.get(h, ()))
                out.append(h if gone[h] == copies else None)
        return out

    def block_hash(self, block: BlockId) -> BlockHash | None:
        """The hash a block holds KV under (None: free, or its owner's alone; for tests)."""
        return self._hash[block]

    def lru_order(self) -> list[BlockId]:
        """Inactive blocks, next to be evicted first (for tests and diagnostics)."""
        out: list[BlockId] = []
        for _, blocks in self._live():
            out += blocks[::-1]
        return out

    def _live(self) -> Iterator[tuple[int, list[BlockId]]]:
        """The LRU's groups and runs, oldest first, with their live blocks (the next to go
        last): (key, blocks).

        A group's block is live while its reference count is the group's key: a
        prefix hit took the others back (the block active again, or released since
        into a newer group).
        """
        refs, runs, groups = self._refs, self._runs, self._groups
        for key in self._queue:
            run = runs.get(key)
            if run is not None:
                yield key, run
                continue
            live = [block for block in groups[key] if refs[block] == key]
            if live:
                yield key, live

    # ----- mutations -----

    def allocate(self, table: list[BlockId], prefix: list[BlockHash], num_new: int) -> bool:
        """Extend a request's block table by cached ``prefix`` copies then ``num_new`` fresh blocks.

        Atomic: when the free list plus evictable blocks (excluding those this
        prefix reuses) cannot supply ``num_new`` blocks, nothing changes and
        the call returns False, so the caller can preempt and retry.
        """
        refs = self._refs
        picks = list(map(self._by_hash.__getitem__, prefix))  # each hash's first cached copy
        taken = 0  # of them, those in the LRU
        if picks:
            held = _getter(*picks)(refs) if len(picks) > 1 else (refs[picks[0]],)
            if max(held) < 0:
                taken = len(picks)
            elif min(held) < 0:
                taken = len([count for count in held if count < 0])
        shortfall = num_new - self.num_free
        if shortfall > 0 and shortfall > self._inactive - taken:
            return False
        table += picks
        if taken == len(picks):  # (their entries in the LRU go stale)
            for block in picks:
                refs[block] = 1
        else:
            for block in picks:
                count = refs[block]
                refs[block] = count + 1 if count > 0 else 1
        self._inactive -= taken
        if num_new <= 0:
            return True
        table += self._take_free(num_new - shortfall if shortfall > 0 else num_new)
        if shortfall > 0:
            # Evicted blocks join the free list's tail: the new blocks are the free ones, then them.
            table += self._evict_oldest(shortfall)
        return True

    def allocate_one(self, table: list[BlockId]) -> bool:
        """``allocate(table, [], 1)``, on the decode path's own short road."""
        block = self._next_id
        if block < self.capacity:
            self._next_id = block + 1
            self._hash.append(None)
            self._refs.append(0)
        elif self._free_head < len(self._free):
            block = self._free[self._free_head]
            self._free_head += 1
            if self._free_head > 4096 and self._free_head * 2 > len(self._free):
                del self._free[: self._free_head]  # as _take_free compacts
                self._compacted += self._free_head
                self._free_head = 0
        elif self._inactive:
            (block,) = self._evict_oldest(1)
        else:
            return False
        table.append(block)
        return True

    def hold(self, blocks: list[BlockId]) -> None:
        """One more reference to each of these active hashed blocks; :meth:`release` drops it."""
        refs, block_hash = self._refs, self._hash
        for block in blocks:
            assert block_hash[block] is not None and refs[block] > 0, f"block {block} not held"
            refs[block] += 1

    def _take_free(self, count: int) -> list[BlockId]:
        fresh = self.capacity - self._next_id
        if count < fresh:
            fresh = count
        if fresh > 0:
            start = self._next_id
            self._next_id = start + fresh
            self._hash += [None] * fresh
            self._refs += [0] * fresh
            taken = list(range(start, start + fresh))
            if fresh == count:
                return taken
        else:
            taken = []
        head = self._free_head
        end = head + count - len(taken)
        taken += self._free[head:end]
        if end > 4096 and end * 2 > len(self._free):
            del self._free[:end]  # compact now and then: amortised O(1) per block
            self._compacted += end
            end = 0
        self._free_head = end
        return taken

    def cache(self, table: list[BlockId], hashes: list[BlockHash], start: int, end: int) -> None:
        """Make blocks ``table[start:end]`` cache-visible under ``hashes[start:end]``.

        Called when their tokens have been computed. A block that already
        carries a hash (a reused prefix copy) is left alone; a newly hashed
        block is held by its own table alone.
        """
        block_hash, refs = self._hash, self._refs
        first_copy = self._by_hash.setdefault  # one look-up of the (large) index, not two
        hashed: list[BlockId] = []  # blocks that already held a hash: left alone
        copies: list[BlockId] = []  # blocks that became extra copies of a visible hash
        for block, h in zip(table[start:end], hashes[start:end], strict=True):
            if block_hash[block] is not None:
                hashed.append(block)
                continue
            block_hash[block] = h
            refs[block] = 1
            if first_copy(h, block) != block:
                self._extra_copies.setdefault(h, []).append(block)
                copies.append(block)
        events = self.events
        if events is None or start >= end:
            return
        if not (hashed or copies):  # (most caching: every hash visible now)
            events.append(KvStored(hashes[start - 1] if start else None, tuple(hashes[start:end])))
            return
        # Runs of the blocks whose hash became visible: a block left alone is passed over,
        # an extra copy ends a run.
        passed, ends = set(hashed), set(copies)
        run: list[BlockHash] = []
        run_parent: BlockHash | None = None
        for i in range(start, end):
            block = table[i]
            if block in passed:
                continue
            if block in ends:
                if run:
                    events.append(KvStored(run_parent, tuple(run)))
                    run = []
                continue
            if not run:
                run_parent = hashes[i - 1] if i > 0 else None
            run.append(hashes[i])
        if run:
            events.append(KvStored(run_parent, tuple(run)))

    def release(
        self, table: list[BlockId], exclusive_from: int | None = None, cached_to: int = 0
    ) -> None:
        """Drop a request's references, last block first (so chain tails evict first).

        Args:
            table: the request's blocks; emptied.
            exclusive_from: blocks from this index on are the request's alone
                (never hashed): those before ``cached_to`` hold computed KV and
                enter the LRU as one run; the rest are freed.
            cached_to: see ``exclusive_from``.
        """
        queue, free = self._queue, self._free
        size = len(table)
        start = size if exclusive_from is None or exclusive_from > size else exclusive_from
        if start < size:
            cached = size if cached_to > size else cached_to
            if cached < start:
                cached = start
            free += table[: cached - 1 : -1] if cached else table[::-1]
            if cached > start:
                run = table[start:cached]  # (the table's tail goes first)
                if self._inactive:
                    self._runs[self._next_run] = run
                    queue.append(self._next_run)
                    self._next_run -= 1
                    self._inactive += cached - start
                else:
                    # A run at an empty LRU's head would be the next taken after the free
                    # list, with no identity to lose: the free list's tail is the same place.
                    free += reversed(run)
                    end = self._compacted + len(free)
                    runs, head = self._cached_free, self._compacted + self._free_head
                    while runs and runs[0][1] <= head:
                        runs.popleft()
                    runs.append((end - len(run), end))
        if start:
            self._enqueue_hashed(table, start)
        table.clear()
        if self._entries > 2 * self._inactive + 4096:
            self._drop_stale()

    def _enqueue_hashed(self, table: list[BlockId], start: int) -> None:
        """Release ``table[:start]`` (hashed blocks, and private ones not yet computed): the
        blocks it held last go into the LRU as one group, the private ones to the free list."""
        refs, key = self._refs, self._next_run
        self._next_run = key - 1
        blocks = table[:start]
        if start > 1 and _getter(*blocks)(refs).count(1) == start:
            # Every block its last holder's (most releases): one store each.
            for block in blocks:
                refs[block] = key
            group = blocks
        else:
            group, free = [], self._free
            for block in table[start - 1 :: -1]:
                held = refs[block]
                if held == 1:  # its last holder: into the LRU
                    refs[block] = key
                    group.append(block)
                elif held:
                    refs[block] = held - 1
                else:
                    free.append(block)  # private (an unhashed block has no references)
            if not group:
                return
            group.reverse()  # (the next to go last)
        self._groups[key] = group
        self._queue.append(key)
        self._inactive += len(group)
        self._entries += len(group)

    def check(self, tables: Iterable[Sequence[BlockId]] | None = None) -> None:
        """Assert the pool's invariants (tests call this after every step).

        Every block must be in exactly one state, judged block by block rather
        than from the pool's own counters: *free* (on the free list once, or an
        id never handed out; no hash), *inactive* (in the LRU: a hashed block
        live in its group, or in a run with no hash) or *active* (on neither
        list). The hash index lists exactly the blocks carrying a hash.

        Args:
            tables: when given, every block table that holds blocks of this
                pool (running, waiting-with-blocks, held and reserved
                requests). Each hashed block's reference count must then equal
                the number of tables listing it, every unhashed active block
                must be listed by exactly one table, and every active block by
                at least one: a block the pool kept after its owner forgot it
                (a leak), or lost while a table still lists it (a double
                release), fails here.

        Costs O(blocks handed out + blocks in tables); the hot path keeps no extra state.
        """
        handed, refs, block_hash = self._next_id, self._refs, self._hash
        assert 0 <= handed <= self.capacity
        assert len(refs) == len(block_hash) == handed
        queue, runs, groups = list(self._queue), self._runs, self._groups
        assert len(set(queue)) == len(queue), "a group is queued twice"
        assert not runs.keys() & groups.keys(), "a key names both a run and a group"
        assert sorted(queue) == sorted([*runs, *groups]), (
            "the queue and its runs and groups disagree"
        )
        assert all(k < 0 for k in queue), "an LRU key is not negative"
        assert self._entries == sum(map(len, groups.values())), "the groups' entries are miscounted"
        free = self._free[self._free_head :]
        free_set = set(free)
        assert len(free_set) == len(free), "a block is on the free list twice"
        assert all(0 <= b < handed for b in free_set), (
            "a free-list entry is not a block id handed out"
        )
        in_runs: list[BlockId] = []
        in_groups: list[BlockId] = []
        for key, blocks in self._live():
            if key in runs:
                assert blocks, "a run is empty"
                in_runs += blocks
                continue
            for block in blocks:
                assert 0 <= block < handed, f"LRU entry {block} is not a block id"
                assert block_hash[block] is not None, f"inactive block {block} has no hash"
            in_groups += blocks
        hashed_set = set(in_groups)
        assert len(hashed_set) == len(in_groups), "a block is live in the LRU twice"
        for block in range(handed):
            if refs[block] < 0:
                assert block in hashed_set, f"block {block} is inactive in no group"
        runs_set = set(in_runs)
        assert len(runs_set) == len(in_runs), "a block is in the runs twice"
        assert not runs_set & free_set, "a block is both free and in a run"
        for block in runs_set:
            assert block_hash[block] is None, f"block {block} in a run carries a hash"
        for block in free_set:
            assert block_hash[block] is None, f"free block {block} still carries a hash"
        inactive = runs_set | hashed_set
        assert not inactive & free_set, "a block is both free and inactive"
        assert len(inactive) == self._inactive, "inactive count disagrees with the LRU"
        active = {b for b in range(handed) if b not in free_set and b not in inactive}
        assert len(active) == self.num_active, "free + inactive + active blocks != capacity"
        for block in active:
            if block_hash[block] is not None:
                assert refs[block] > 0, f"active hashed block {block} has no references"
        for block in range(handed):
            if block_hash[block] is None:  # (release tells a private block by this)
                assert refs[block] == 0, f"unhashed block {block} has references"
        indexed = list(self._by_hash.values())
        for h, block in self._by_hash.items():
            assert block_hash[block] == h, f"hash index points {h} at block {block}"
        for h, copies in self._extra_copies.items():
            assert copies and h in self._by_hash, "extra copies without a first copy"
            for block in copies:
                assert block_hash[block] == h, f"extra copy {block} of {h} carries another hash"
            indexed += copies
        named = [b for b in range(handed) if block_hash[b] is not None]
        assert len(set(indexed)) == len(indexed), "a block is indexed twice"
        assert set(indexed) == set(named), "hash index and block hashes disagree"
        if tables is None:
            return
        counted = [0] * handed
        for table in tables:
            assert len(set(table)) == len(table), f"a block table lists a block twice: {table}"
            for block in table:
                assert 0 <= block < handed, f"a table lists block {block}, never handed out"
                assert block not in free_set, f"block {block} is held by a table but is free"
                assert block not in inactive, f"block {block} is held by a table but is inactive"
                counted[block] += 1
        for block in active:
            assert counted[block], f"block {block} leaked: on no list and in no table"
            if block_hash[block] is not None:
                assert refs[block] == counted[block], (
                    f"block {block}: {refs[block]} references recorded, "
                    f"{counted[block]} tables hold it"
                )
            else:
                assert counted[block] == 1, (
                    f"unhashed active block {block} is held by {counted[block]} tables"
                )

    # ----- internals -----

    def _evict_oldest(self, count: int) -> list[BlockId]:
        """Evict ``count`` inactive blocks, oldest first; return their ids in that order.

        Hashes whose last copy goes are published as one Removed event.
        """
        queue, runs, groups, refs = self._queue, self._runs, self._groups, self._refs
        block_hash, by_hash, extra = self._hash, self._by_hash, self._extra_copies
        evicted: list[BlockId] = []
        removed: list[BlockHash] = []
        self._inactive -= count
        while count:
            key = queue[0]
            run = runs.get(key)
            if run is not None:
                if len(run) > count:
                    evicted += run[: -count - 1 : -1]
                    del run[-count:]
                    break
                queue.popleft()
                del runs[key]
                evicted += reversed(run)
                count -= len(run)
                continue
            group = groups[key]
            size = len(group)
            tail = group[size - count :] if size > count else group  # (the next to go last)
            # Its live blocks (one block: itemgetter gives it bare, and -1 sends it to the walk).
            live = _getter(*tail)(refs).count(key) if len(tail) > 1 else -1
            if not live:
                done = len(tail)  # all stale: a later release holds them, or a request
            elif live == len(tail) and not extra:
                # All of them live, each its hash's only copy (most evictions): in bulk.
                hashes = _getter(*tail)(block_hash)
                for block in tail:
                    block_hash[block] = None
                    refs[block] = 0
                for h in hashes:
                    del by_hash[h]
                evicted += reversed(tail)
                removed += reversed(hashes)
                done = len(tail)
                count -= done
            else:
                pos = size
                while pos:
                    pos -= 1
                    block = group[pos]
                    if refs[block] != key:
                        continue  # stale: a prefix hit took it back (it may be in a newer group)
                    h = block_hash[block]
                    block_hash[block] = None
                    refs[block] = 0
                    evicted.append(block)
                    if extra and h in extra:
                        self._forget_copy(h, block)
                    else:
                        del by_hash[h]  # type: ignore[arg-type]
                        removed.append(h)  # type: ignore[arg-type]
                    count -= 1
                    if not count:
                        break
                done = size - pos
            self._entries -= done
            if done == size:
                queue.popleft()
                del groups[key]
            else:
                del group[size - done :]
        if removed and self.events is not None:
            self.events.append(KvRemoved(tuple(removed)))
        return evicted

    def _drop_stale(self) -> None:
        """Keep only the groups' live entries, in order."""
        live = dict(self._live())
        groups = self._groups
        for key in self._queue:
            if key in groups:
                if key in live:
                    groups[key] = live[key]
                else:
                    del groups[key]
        self._queue = deque(live)
        self._entries = sum(map(len, groups.values()))

    def _forget_copy(self, h: BlockHash, block: BlockId) -> None:
        """Drop one of several copies of ``h``; the hash stays visible."""
        copies = self._extra_copies[h]
        if self._by_hash[h] == block:
            self._by_hash[h] = copies.pop(0)
        else:
            copies.remove(block)
        if not copies:
            del self._extra_copies[h]
