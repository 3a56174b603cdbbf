"""SGLang-style paged radix KV cache of one DP rank, with its request-level manager.

Behaviour follows the reference's ``cache/radix_cache.rs`` and
``kv_manager/sglang_backend.rs`` (aisimulate-core 0.13.0, which Dynamo 1.6.1
runs). Three layers, as there:

- :class:`PagePool` hands out physical pages (one page = ``page_size`` tokens,
  the rank's ``num_gpu_blocks`` pages in all). Its free list is LIFO: the pages
  freed last are reused first, before ids never handed out (0, 1, 2, ...).
- :class:`RadixCache` is a compressed radix tree over pages. An edge holds one
  *local* page hash per page (``key``) and the physical page ids that hold
  them (``value``); children are keyed by their first page's hash::

      root ─┬─ [h0 h1 h2] (pages 0 1 2) ─┬─ [h3]    (page 3)
            │                            └─ [h7 h8] (pages 9 4)
            └─ [h5] (page 5)

  A node's ``lock_ref`` counts the leases whose path runs through it; locked
  tokens are *protected*, the rest *evictable*. Eviction takes unlocked leaves
  least recently accessed first, trimming a leaf's newest pages when only part
  of it is needed.
- :class:`RadixKvManager` is what the SGLang scheduler calls: allocate a first
  chunk (match and lock the cached prefix, evict if free pages are short),
  extend a chunked prefill, grow by decode tokens from a reservation, insert
  completed pages while running, finish, retract. It publishes KV events.

Access times are a logical counter advanced by every tree operation, not the
reference's wall clock (``Instant::now()`` per operation): both are strictly
increasing, so they order nodes the same way. A timestamp is only ever shared
by nodes on one root path, which can never be leaves together, so no two
evictable leaves tie and the reference's node-id tie-break never decides.

KV events (when a sink is attached): ``Stored`` for the complete pages a
request is given or inserts, chained from the parent page's published hash
(``hashing.chain``), each physical page published once; ``Removed`` when the
last page advertising a hash is freed or evicted (a per-hash count of pages).
Pages never published (a reservation's unused pages, a cancelled transfer's)
are freed silently.

Invariants (checked by :meth:`RadixKvManager.check`): every page is free, in
the tree, or held privately by exactly one lease or reservation; evictable plus
protected tokens equal the tokens in the tree; a node's lock count is the
number of leases locking it or a descendant; the evictable index holds exactly
the unlocked non-root leaves.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from servesim.engine.kv.block_pool import KvEvent, KvRemoved, KvStored
from servesim.engine.kv.hashing import chain

PageId = int
PageHash = int


class PagePool:
    """Physical pages of one rank: a LIFO free list, then ids never handed out."""

    __slots__ = ("_free", "_next_fresh", "page_size", "total_pages")

    def __init__(self, total_pages: int, page_size: int) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.total_pages = total_pages
        self.page_size = page_size
        self._free: list[PageId] = []
        self._next_fresh = 0

    @property
    def num_free_pages(self) -> int:
        """Pages holding nothing."""
        return len(self._free) + self.total_pages - self._next_fresh

    @property
    def available_tokens(self) -> int:
        """Token slots on free pages."""
        return self.num_free_pages * self.page_size

    def allocate(self, count: int) -> list[PageId] | None:
        """Take ``count`` pages, or None (taking nothing) if fewer are free.

        Recycled pages come first: the last ``count`` freed, in the order they
        were freed; then fresh ids in increasing order.
        """
        if count > self.num_free_pages:
            return None
        free = self._free
        recycled = min(count, len(free))
        split = len(free) - recycled
        pages = free[split:]
        del free[split:]
        fresh = count - recycled
        if fresh:
            start = self._next_fresh
            pages += range(start, start + fresh)
            self._next_fresh = start + fresh
        return pages

    def free(self, pages: Iterable[PageId]) -> None:
        """Return pages, in this order, to the free list's tail."""
        self._free += pages

    def free_list(self) -> list[PageId]:
        """Freed pages waiting for reuse, next taken last (for tests and checks)."""
        return list(self._free)

    @property
    def num_handed_out(self) -> int:
        """Ids handed out at least once (0 .. this - 1)."""
        return self._next_fresh


class TreeNode:
    """One compressed edge of the radix tree and the node it leads to.

    ``key[i]`` is the local hash of page ``value[i]``; both are empty only for
    the root. ``indexed`` mirrors membership in the evictable-leaf index;
    ``queued`` is the access time of this node's live heap entry, if any.
    """

    __slots__ = (
        "children",
        "indexed",
        "key",
        "last_access",
        "lock_ref",
        "parent",
        "queued",
        "uid",
        "value",
    )

    def __init__(
        self,
        parent: TreeNode | None,
        key: list[PageHash],
        value: list[PageId],
        last_access: int,
        uid: int,
    ) -> None:
        self.parent = parent
        self.key = key
        self.value = value
        self.children: dict[PageHash, TreeNode] = {}
        self.lock_ref = 0
        self.last_access = last_access
        self.uid = uid
        self.indexed = False
        self.queued: int | None = None

    def __repr__(self) -> str:
        return (
            f"TreeNode(uid={self.uid}, pages={self.value}, lock_ref={self.lock_ref}, "
            f"last_access={self.last_access}, children={len(self.children)})"
        )


class RadixCache:
    """The radix tree of one rank over its :class:`PagePool`.

    ``evictable_size`` and ``protected_size`` are token counts of the pages in
    unlocked and locked nodes. Unlocked non-root leaves sit in a heap keyed by
    (last access, node uid) with lazy deletion: a node's stale entries are
    skipped when popped, and the heap is rebuilt when they outnumber the live
    ones, so every operation is O(path + log leaves), never O(tree).
    """

    __slots__ = (
        "_clock",
        "_heap",
        "_next_uid",
        "_num_indexed",
        "evictable_size",
        "page_size",
        "pool",
        "protected_size",
        "root",
    )

    def __init__(self, total_pages: int, page_size: int) -> None:
        self.pool = PagePool(total_pages, page_size)
        self.page_size = page_size
        self.root = TreeNode(None, [], [], 0, 0)
        self.evictable_size = 0
        self.protected_size = 0
        self._clock = 0
        self._next_uid = 1
        self._heap: list[tuple[int, int, TreeNode]] = []
        self._num_indexed = 0

    # ----- counts -----

    @property
    def available_tokens(self) -> int:
        """Token slots on free pages."""
        return self.pool.available_tokens

    @property
    def total_tokens(self) -> int:
        """Token slots on all pages."""
        return self.pool.total_pages * self.page_size

    # ===== Public API =====

    def prefix_match_len(self, hashes: list[PageHash], num_pages: int | None = None) -> int:
        """Tokens of the longest cached prefix of ``hashes[:num_pages]``; changes nothing.

        The read-only match the scheduler scores and sizes admissions with: no
        split, no access-time update.
        """
        end = len(hashes) if num_pages is None else min(num_pages, len(hashes))
        node, matched = self.root, 0
        while matched < end:
            child = node.children.get(hashes[matched])
            if child is None:
                break
            common = _common_length(child.key, hashes, matched, end)
            matched += common
            if common < len(child.key):
                break
            node = child
        return matched * self.page_size

    def match_prefix(
        self, hashes: list[PageHash], num_pages: int | None = None, *, lock: bool = False
    ) -> tuple[int, TreeNode]:
        """Match ``hashes[:num_pages]`` from the root; optionally lock the matched path.

        A match ending inside an edge splits it, so the returned node ends
        exactly at the match; the new prefix node keeps the edge's lock count
        and access time. Fully matched nodes are touched (the terminal one last).

        Returns:
            (matched tokens, the node the match ends at; the root if none).
        """
        end = len(hashes) if num_pages is None else min(num_pages, len(hashes))
        now = self._tick()
        node, matched = self.root, 0
        pending: TreeNode | None = None
        while matched < end:
            child = node.children.get(hashes[matched])
            if child is None:
                break
            if pending is not None:
                self._touch(pending, now)
                pending = None
            common = _common_length(child.key, hashes, matched, end)
            matched += common
            if common < len(child.key):
                node = self._split(child, common)
                break
            node = pending = child
        if pending is not None:
            if lock:
                pending.last_access = now  # unindexed by the lock below, so no heap entry
            else:
                self._touch(pending, now)
        if lock:
            self.inc_lock_ref(node)
        return matched * self.page_size, node

    def insert(
        self, node: TreeNode, hashes: list[PageHash], pages: list[PageId], start: int, end: int
    ) -> TreeNode:
        """Insert pages ``start:end`` (hashes and page ids) below ``node``, which ends at ``start``.

        ``node`` is the caller's own locked tail (or the root). Its path is
        touched; then the walk extends an unlocked leaf (or ``node`` itself
        when only the caller locks it), descends through fully matching edges,
        splits a partially matching one, and hangs the rest on a new leaf.
        Pages already in the tree keep their ids there: the caller compares and
        frees its duplicates.

        Returns:
            the node whose path ends at page ``end``.
        """
        if start >= end:
            return node
        now = self._tick()
        self._touch_path(node, now)
        current, offset = node, start
        while offset < end:
            if self._can_extend(current, node):
                self._extend_leaf(current, hashes[offset:end], pages[offset:end], now)
                return current
            child = current.children.get(hashes[offset])
            if child is None:
                return self._add_child(current, hashes[offset:end], pages[offset:end])
            common = _common_length(child.key, hashes, offset, end)
            offset += common
            if common < len(child.key):
                split = self._split(child, common)
                if offset < end:
                    return self._add_child(split, hashes[offset:end], pages[offset:end])
                return split
            current = child
            self._touch(current, now)
        return current

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Lock ``node`` and its ancestors (protecting their tokens from eviction)."""
        ps = self.page_size
        root = self.root
        while node is not root:
            if node.lock_ref == 0:
                if node.indexed:
                    self._unindex(node)
                tokens = len(node.key) * ps
                self.evictable_size -= tokens
                self.protected_size += tokens
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]  # only the root has none

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one :meth:`inc_lock_ref` of ``node``; unlocked leaves become evictable."""
        ps = self.page_size
        root = self.root
        while node is not root:
            assert node.lock_ref > 0, f"lock count of {node} would go negative"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                tokens = len(node.key) * ps
                self.protected_size -= tokens
                self.evictable_size += tokens
                if not node.children:
                    self._index(node)
            node = node.parent  # type: ignore[assignment]  # only the root has none

    def evict(self, num_tokens: int) -> list[PageId]:
        """Free at least ``num_tokens`` (in whole pages) from unlocked leaves, oldest first.

        A leaf longer than what is still needed loses only its newest pages and
        stays evictable; a leaf deleted whole may leave its parent an unlocked
        leaf, evictable in turn. Stops early when nothing evictable is left.

        Returns:
            the freed pages, in the order they joined the free list.
        """
        ps = self.page_size
        evicted: list[PageId] = []
        while len(evicted) * ps < num_tokens:
            victim = self._pop_oldest_leaf()
            if victim is None:
                break
            need = -(-(num_tokens - len(evicted) * ps) // ps)
            if need < len(victim.value):
                cut = len(victim.value) - need
                gone = victim.value[cut:]
                del victim.key[cut:], victim.value[cut:]
                self.evictable_size -= need * ps
                self._index(victim)
            else:
                gone = victim.value
                self.evictable_size -= len(gone) * ps
                self._remove_leaf(victim)
            self.pool.free(gone)
            evicted += gone
        return evicted

    def path_pages(self, node: TreeNode, num_pages: int) -> list[PageId]:
        """The first ``num_pages`` page ids on the path from the root to ``node``."""
        parts: list[list[PageId]] = []
        while node is not self.root:
            parts.append(node.value)
            node = node.parent  # type: ignore[assignment]  # only the root has none
        pages: list[PageId] = []
        for part in reversed(parts):
            pages += part
        assert len(pages) >= num_pages, f"path has {len(pages)} pages, {num_pages} wanted"
        del pages[num_pages:]
        return pages

    def nodes(self) -> Iterator[TreeNode]:
        """Every node, root first, parents before children (for tests and checks)."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def lru_leaves(self) -> list[TreeNode]:
        """Evictable leaves, next evicted first (for tests and diagnostics)."""
        live = [n for n in self.nodes() if n.indexed]
        return sorted(live, key=lambda n: (n.last_access, n.uid))

    def check(self) -> None:
        """Assert the tree's invariants: structure, sizes, lock counts and eviction index.

        Costs O(nodes + heap entries); tests call it after every step.
        """
        ps = self.page_size
        root = self.root
        assert not root.key and not root.value and root.lock_ref == 0 and not root.indexed
        evictable = protected = indexed = 0
        seen_pages: set[PageId] = set()
        for node in self.nodes():
            for first, child in node.children.items():
                assert child.parent is node, f"{child} does not point back to its parent"
                assert child.key and child.key[0] == first, f"{child} filed under {first}"
            if node is root:
                continue
            assert len(node.key) == len(node.value) > 0, f"{node} key and value disagree"
            assert node.lock_ref >= 0, f"{node} has a negative lock count"
            below = sum(c.lock_ref for c in node.children.values())
            assert node.lock_ref >= below, f"{node} is locked less than its children"
            assert not seen_pages.intersection(node.value), f"{node} repeats a page in the tree"
            seen_pages.update(node.value)
            tokens = len(node.key) * ps
            if node.lock_ref:
                protected += tokens
            else:
                evictable += tokens
            should = node.lock_ref == 0 and not node.children
            assert node.indexed == should, f"{node}: indexed={node.indexed}, should be {should}"
            indexed += should
        assert (evictable, protected) == (self.evictable_size, self.protected_size), (
            f"sizes {self.evictable_size}/{self.protected_size}, tree has {evictable}/{protected}"
        )
        assert indexed == self._num_indexed, "evictable leaf count drifted"
        live = {id(n) for t, _, n in self._heap if n.indexed and n.last_access == t == n.queued}
        assert len(live) == indexed, "an evictable leaf has no live heap entry"
        assert seen_pages.isdisjoint(self.pool.free_list()), "a page is both free and in the tree"

    # ===== Internal helpers =====

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _index(self, node: TreeNode) -> None:
        node.indexed = True
        self._num_indexed += 1
        self._queue(node)

    def _unindex(self, node: TreeNode) -> None:
        node.indexed = False
        self._num_indexed -= 1

    def _queue(self, node: TreeNode) -> None:
        """Give an indexed node a heap entry at its access time, unless it has one."""
        if node.queued == node.last_access:
            return
        node.queued = node.last_access
        heapq.heappush(self._heap, (node.last_access, node.uid, node))
        if len(self._heap) > 2 * self._num_indexed + 1024:
            self._compact()

    def _compact(self) -> None:
        """Drop stale entries; an unindexed node loses its entry (and its ``queued`` mark)."""
        live: list[tuple[int, int, TreeNode]] = []
        for entry in self._heap:
            node = entry[2]
            if node.queued == entry[0]:
                if node.indexed:
                    live.append(entry)
                else:
                    node.queued = None
        heapq.heapify(live)
        self._heap = live

    def _pop_oldest_leaf(self) -> TreeNode | None:
        heap = self._heap
        while heap:
            at, _, node = heapq.heappop(heap)
            if node.queued != at:
                continue  # superseded by a later entry of the same node
            node.queued = None
            if node.indexed and node.last_access == at:
                self._unindex(node)
                return node
        return None

    def _touch(self, node: TreeNode, now: int) -> None:
        node.last_access = now
        if node.indexed:
            self._queue(node)

    def _touch_path(self, node: TreeNode | None, now: int) -> None:
        while node is not None:
            self._touch(node, now)
            node = node.parent

    def _can_extend(self, node: TreeNode, start: TreeNode) -> bool:
        if node is self.root or node.children:
            return False
        return node.lock_ref == 0 or (node is start and node.lock_ref == 1)

    def _extend_leaf(
        self, node: TreeNode, key: list[PageHash], value: list[PageId], now: int
    ) -> None:
        node.key += key
        node.value += value
        tokens = len(key) * self.page_size
        if node.lock_ref:
            self.protected_size += tokens
        else:
            self.evictable_size += tokens
        self._touch(node, now)

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """Cut ``child``'s edge after ``at`` pages; the new prefix node takes its place.

        ``child`` keeps the suffix (and its index entry); the prefix node copies
        its lock count and access time, so no size total changes.
        """
        parent = child.parent
        assert parent is not None and 0 < at < len(child.key)
        prefix = TreeNode(parent, child.key[:at], child.value[:at], child.last_access, self._uid())
        prefix.lock_ref = child.lock_ref
        del child.key[:at], child.value[:at]
        prefix.children[child.key[0]] = child
        child.parent = prefix
        parent.children[prefix.key[0]] = prefix
        return prefix

    def _add_child(self, parent: TreeNode, key: list[PageHash], value: list[PageId]) -> TreeNode:
        node = TreeNode(parent, key, value, self._tick(), self._uid())
        if parent.indexed:
            self._unindex(parent)
        parent.children[key[0]] = node
        self.evictable_size += len(key) * self.page_size
        self._index(node)
        return node

    def _remove_leaf(self, node: TreeNode) -> None:
        parent = node.parent
        assert parent is not None
        del parent.children[node.key[0]]
        node.parent = None
        if parent is not self.root and not parent.children and parent.lock_ref == 0:
            self._index(parent)

    def _uid(self) -> int:
        uid = self._next_uid
        self._next_uid = uid + 1
        return uid


def _common_length(key: list[PageHash], hashes: list[PageHash], start: int, end: int) -> int:
    """How many leading entries of ``key`` equal ``hashes[start:end]``'s."""
    n = min(len(key), end - start)
    # One C-level slice comparison settles the common case (the whole edge matches).
    if hashes[start : start + n] == (key if n == len(key) else key[:n]):
        return n
    i = 0
    while i < n and key[i] == hashes[start + i]:
        i += 1
    return i


class RadixLease:
    """A request's hold on KV pages: its page ids and the locked end of its cached path.

    ``page_hashes`` are the local hashes of the request's complete pages; the
    caller extends them as the sequence grows (before the calls that need
    them) and they survive a retraction. The rest exists while the lease is
    active (``last_node`` set)::

        tokens   |<- cached_tokens ->|<- private ->|
        pages    | p0  p1  p2 (tree) | p3  p4 (own, p4 partial) |
                                     ^ num_tokens ends inside p4

    ``pages[: cached_tokens // page_size]`` are the tree's pages on the path
    to ``last_node``; the rest are held by this lease alone.
    """

    __slots__ = ("cached_tokens", "last_node", "num_tokens", "page_hashes", "pages")

    def __init__(self, page_hashes: list[PageHash] | None = None) -> None:
        self.page_hashes: list[PageHash] = [] if page_hashes is None else page_hashes
        self.pages: list[PageId] = []
        self.num_tokens = 0
        self.cached_tokens = 0
        self.last_node: TreeNode | None = None

    @property
    def active(self) -> bool:
        """Whether the lease holds pages and a lock."""
        return self.last_node is not None

    def clear(self) -> None:
        """Forget pages, tokens and lock (the manager calls this on release); keep the hashes."""
        self.pages = []
        self.num_tokens = 0
        self.cached_tokens = 0
        self.last_node = None

    def __repr__(self) -> str:
        return (
            f"RadixLease(tokens={self.num_tokens}, cached={self.cached_tokens}, "
            f"pages={self.pages}, active={self.active})"
        )


class DecodeReservation:
    """Pages set aside before a decode step; each token crossing a page boundary takes one."""

    __slots__ = ("next", "pages")

    def __init__(self, pages: list[PageId]) -> None:
        self.pages = pages
        self.next = 0

    def __len__(self) -> int:
        return len(self.pages) - self.next

    def take(self) -> PageId:
        """The next reserved page (running out is a broken invariant)."""
        assert self.next < len(self.pages), "decode reservation exhausted"
        page = self.pages[self.next]
        self.next += 1
        return page


class DestinationReservation:
    """A decode-side reservation for a prompt's KV arriving from a prefill worker.

    ``prefix_pages`` are the locked cached prefix (``prefix_len`` tokens);
    ``fresh_pages`` receive the transferred rest.
    """

    __slots__ = ("fresh_pages", "last_node", "page_size", "prefix_len", "prefix_pages")

    def __init__(
        self,
        prefix_len: int,
        prefix_pages: list[PageId],
        last_node: TreeNode,
        fresh_pages: list[PageId],
        page_size: int,
    ) -> None:
        self.prefix_len = prefix_len
        self.prefix_pages = prefix_pages
        self.last_node = last_node
        self.fresh_pages = fresh_pages
        self.page_size = page_size

    @property
    def transferable_prompt_tokens(self) -> int:
        """Tokens the transfer must fill: the fresh pages' slots."""
        return len(self.fresh_pages) * self.page_size


class RadixKvManager:
    """The SGLang KV backend of one rank: request leases over a :class:`RadixCache`.

    Args:
        total_pages: pages of the rank (``num_gpu_blocks``).
        page_size: tokens per page (the block size).
        events: sink for KV events, or None to publish nothing (and keep no
            per-page hash bookkeeping).
        enable_prefix_caching: when False nothing is matched or inserted; a
            finished request frees all its pages.
    """

    __slots__ = (
        "_hash_refs",
        "_page_hash",
        "cache",
        "enable_prefix_caching",
        "events",
        "page_size",
    )

    def __init__(
        self,
        total_pages: int,
        page_size: int,
        *,
        events: list[KvEvent] | None = None,
        enable_prefix_caching: bool = True,
    ) -> None:
        self.cache = RadixCache(total_pages, page_size)
        self.page_size = page_size
        self.events = events
        self.enable_prefix_caching = enable_prefix_caching
        # Published sequence hash of each page, and how many pages advertise each hash.
        self._page_hash: list[PageHash | None] = [None] * total_pages if events is not None else []
        self._hash_refs: dict[PageHash, int] = {}

    # ----- counts -----

    @property
    def available_tokens(self) -> int:
        """Token slots on free pages."""
        return self.cache.pool.available_tokens

    @property
    def evictable_tokens(self) -> int:
        """Tokens in unlocked tree nodes."""
        return self.cache.evictable_size

    @property
    def protected_tokens(self) -> int:
        """Tokens in locked tree nodes."""
        return self.cache.protected_size

    @property
    def total_tokens(self) -> int:
        """Token slots on all pages."""
        return self.cache.total_tokens

    # ===== Public API =====

    def prefix_match_len(self, hashes: list[PageHash], num_pages: int | None = None) -> int:
        """Cached tokens of ``hashes[:num_pages]``, read-only (see :meth:`RadixCache.prefix_match_len`)."""
        return self.cache.prefix_match_len(hashes, num_pages)

    def allocate(
        self, lease: RadixLease, num_tokens: int, match_limit: int | None = None
    ) -> int | None:
        """Give an inactive lease pages for its first ``num_tokens`` tokens.

        Locks the cached prefix of the lease's page hashes (at most
        ``match_limit`` tokens, page-floored), evicts other cached pages if
        free pages are short, then takes fresh pages for the rest. Publishes
        Stored for the complete pages past the prefix.

        Returns:
            the cached prefix in tokens, or None (nothing held, lock released)
            when free plus evictable pages cannot cover the rest.
        """
        assert not lease.active, "request KV lease is already active"
        ps = self.page_size
        full = num_tokens // ps
        assert len(lease.page_hashes) >= full, "lease lacks hashes for its complete pages"
        limit = full if match_limit is None else min(full, match_limit // ps)
        cache = self.cache
        prefix_len, node = (
            cache.match_prefix(lease.page_hashes, limit, lock=True)
            if self.enable_prefix_caching
            else (0, cache.root)
        )
        required = -(-num_tokens // ps) - prefix_len // ps
        if not self._make_room(required):
            cache.dec_lock_ref(node)
            return None
        pages = cache.path_pages(node, prefix_len // ps)
        fresh = cache.pool.allocate(required)
        if fresh is None:
            cache.dec_lock_ref(node)
            return None
        pages += fresh
        self._publish_stored(lease.page_hashes, pages, full, prefix_len // ps)
        lease.pages = pages
        lease.num_tokens = num_tokens
        lease.cached_tokens = prefix_len
        lease.last_node = node
        return prefix_len

    def extend(self, lease: RadixLease, num_tokens: int) -> int | None:
        """Grow an active lease to ``num_tokens`` tokens (a chunked prefill's next chunk).

        Never re-matches: only the pages the lease lacks are taken, evicting
        cached pages if free ones are short. Publishes Stored for pages that
        became complete.

        Returns:
            the tokens the lease held before, or None (nothing changed) when
            free plus evictable pages cannot cover the growth.
        """
        before = lease.num_tokens
        if not lease.active or before > num_tokens:
            raise ValueError(f"cannot extend {lease} to {num_tokens} tokens")
        ps = self.page_size
        assert len(lease.page_hashes) >= num_tokens // ps, "lease lacks hashes for its pages"
        needed = max(0, -(-num_tokens // ps) - len(lease.pages))
        if not self._make_room(needed):
            return None
        fresh = self.cache.pool.allocate(needed)
        if fresh is None:
            return None
        lease.pages += fresh
        lease.num_tokens = num_tokens
        self._publish_stored(lease.page_hashes, lease.pages, num_tokens // ps, before // ps)
        return before

    def cache_prefix(self, lease: RadixLease, num_tokens: int) -> None:
        """Insert the lease's complete pages through ``num_tokens`` into the tree, keeping it locked.

        Called when a chunk or a decode token completes a page. The lock moves
        to the new path end (taken before the old one is released). Where the
        tree already holds a page for a hash (another request inserted it
        first), the lease switches to that canonical page and frees its own.
        """
        if not self.enable_prefix_caching:
            return
        ps = self.page_size
        end = num_tokens // ps
        if end * ps <= lease.cached_tokens:
            return
        node = lease.last_node
        assert node is not None and end * ps <= lease.num_tokens, f"cannot cache {lease}"
        assert len(lease.page_hashes) >= end, "lease lacks hashes for its complete pages"
        first = lease.cached_tokens // ps
        self._publish_stored(lease.page_hashes, lease.pages, end, first)
        tail = self.cache.insert(node, lease.page_hashes, lease.pages, first, end)
        if tail is not node:
            self.cache.inc_lock_ref(tail)
        self._free_pages(self._canonicalize(lease.pages, tail, first, end))
        if tail is not node:
            self.cache.dec_lock_ref(node)
        lease.last_node = tail
        lease.cached_tokens = end * ps

    def reserve_decode_pages(self, count: int) -> DecodeReservation | None:
        """Set aside ``count`` free pages for a decode step (no eviction), or None."""
        pages = self.cache.pool.allocate(count)
        return None if pages is None else DecodeReservation(pages)

    def extend_decode(
        self, lease: RadixLease, reservation: DecodeReservation, num_tokens: int = 1
    ) -> None:
        """Give an active lease ``num_tokens`` more token slots, taking a reserved page per boundary.

        A token landing at a page start takes the reservation's next page, so
        the lease keeps ``ceil(num_tokens / page_size)`` pages; computed in one
        step rather than token by token.
        """
        assert lease.last_node is not None, "decode growth needs an active lease"
        ps = self.page_size
        n = lease.num_tokens
        grow = (n + num_tokens + ps - 1) // ps - (n + ps - 1) // ps
        if grow:
            start = reservation.next
            assert start + grow <= len(reservation.pages), "decode reservation exhausted"
            lease.pages += reservation.pages[start : start + grow]
            reservation.next = start + grow
        lease.num_tokens = n + num_tokens

    def release_decode_reservation(self, reservation: DecodeReservation) -> None:
        """Free a reservation's unused pages (never published, so no event)."""
        rest = reservation.pages[reservation.next :]
        reservation.next = len(reservation.pages)
        self.cache.pool.free(rest)

    def finish(self, lease: RadixLease, num_tokens: int) -> None:
        """End a completed request: cache its page-floored sequence, free the rest, unlock.

        ``num_tokens`` is the sequence length; pages past the complete ones it
        covers (the partial tail) are freed, the complete ones inserted, and
        duplicates of pages the tree already holds freed.
        """
        node = lease.last_node
        if node is None:
            assert not lease.pages and lease.num_tokens == 0
            return
        cache, ps = self.cache, self.page_size
        pages = lease.pages
        if not self.enable_prefix_caching:
            self._free_pages(pages)
            cache.dec_lock_ref(node)
            lease.clear()
            return
        end = min(num_tokens, lease.num_tokens) // ps
        first = lease.cached_tokens // ps
        assert lease.cached_tokens <= end * ps, f"cannot finish {lease} at {num_tokens} tokens"
        self._free_pages(pages[end:])
        del pages[end:]
        if end:
            assert len(lease.page_hashes) >= end, "lease lacks hashes for its complete pages"
            self._publish_stored(lease.page_hashes, pages, end, first)
            tail = cache.insert(node, lease.page_hashes, pages, first, end)
            self._free_pages(self._canonicalize(pages, tail, first, end))
        cache.dec_lock_ref(node)
        lease.clear()

    def retract(self, lease: RadixLease) -> bool:
        """Release an active lease: free its pages past the cached prefix and unlock.

        The cached prefix stays in the tree, now evictable unless locked by
        others; the lease keeps its page hashes for re-admission.

        Returns:
            whether this freed pages or released a lock (False for an inactive lease).
        """
        node = lease.last_node
        if node is None:
            assert not lease.pages and lease.num_tokens == 0
            return False
        assert lease.cached_tokens <= lease.num_tokens
        owned = lease.pages[lease.cached_tokens // self.page_size :]
        improved = bool(owned) or node is not self.cache.root
        self._free_pages(owned)
        self.cache.dec_lock_ref(node)
        lease.clear()
        return improved

    def evict(self, num_tokens: int) -> int:
        """Evict at least ``num_tokens`` cached tokens, oldest leaves first; publish Removed.

        Returns:
            tokens evicted (whole pages; less than asked when too little is evictable).
        """
        pages = self.cache.evict(num_tokens)
        self._publish_removed(pages)
        return len(pages) * self.page_size

    def reserve_destination(
        self, hashes: list[PageHash], num_tokens: int
    ) -> DestinationReservation | None:
        """Reserve pages for a prompt of ``num_tokens`` whose KV will be transferred in.

        Locks the cached prefix of ``hashes``, evicts if needed and takes fresh
        pages for the rest of the (page-rounded) prompt.
        """
        cache, ps = self.cache, self.page_size
        prefix_len, node = (
            cache.match_prefix(hashes, lock=True) if self.enable_prefix_caching else (0, cache.root)
        )
        prefix_pages = cache.path_pages(node, prefix_len // ps)
        fresh = max(0, -(-num_tokens // ps) * ps - prefix_len) // ps
        pages = cache.pool.allocate(fresh) if self._make_room(fresh) else None
        if pages is None:
            cache.dec_lock_ref(node)
            return None
        return DestinationReservation(prefix_len, prefix_pages, node, pages, ps)

    def activate_destination(
        self, reservation: DestinationReservation, lease: RadixLease, num_tokens: int
    ) -> int:
        """Turn a filled destination reservation into the lease of a prompt of ``num_tokens``.

        The prompt's complete pages are published and inserted as cached.

        Returns:
            the prefix that was already cached, in tokens.
        """
        pages = reservation.prefix_pages + reservation.fresh_pages
        node, cached = reservation.last_node, 0
        lease.pages = pages
        lease.num_tokens = num_tokens
        lease.cached_tokens = reservation.prefix_len
        lease.last_node = node
        if self.enable_prefix_caching:
            self.cache_prefix(lease, num_tokens)
            cached = num_tokens // self.page_size * self.page_size
        lease.cached_tokens = cached
        return reservation.prefix_len

    def cancel_destination(self, reservation: DestinationReservation) -> None:
        """Drop an unused destination reservation: unlock, free its fresh pages silently."""
        self.cache.dec_lock_ref(reservation.last_node)
        self.cache.pool.free(reservation.fresh_pages)
        reservation.fresh_pages = []

    def check(
        self,
        leases: Iterable[RadixLease] | None = None,
        reservations: Iterable[DecodeReservation | DestinationReservation] = (),
    ) -> None:
        """Assert the invariants of the tree, the pages and the event bookkeeping.

        Args:
            leases: when given, every lease of this rank (active or not), with
                ``reservations`` every live reservation. Then every page handed
                out must be exactly one of free, in the tree, or held privately
                by one lease or reservation (no leak, no double free), and
                every node's lock count must equal the leases and destination
                reservations locking it or a node below it.
        """
        cache = self.cache
        cache.check()
        tree = [page for node in cache.nodes() for page in node.value]
        free = cache.pool.free_list()
        self._check_hashes(free)
        if leases is None:
            return
        tree_set = set(tree)
        direct: dict[int, int] = {}
        private: list[PageId] = []
        for lease in leases:
            private += self._check_lease(lease, tree_set, direct)
        for res in reservations:
            if isinstance(res, DecodeReservation):
                private += res.pages[res.next :]
                continue
            private += res.fresh_pages
            assert cache.path_pages(res.last_node, len(res.prefix_pages)) == res.prefix_pages
            direct[id(res.last_node)] = direct.get(id(res.last_node), 0) + 1
        held = free + private + tree
        handed = cache.pool.num_handed_out
        assert len(set(held)) == len(held), "a page is in two places (free, tree, private)"
        assert sorted(held) == list(range(handed)), "pages leaked or never handed out"
        self._check_locks(direct)

    # ===== Internal helpers =====

    def _make_room(self, num_pages: int) -> bool:
        """Evict so ``num_pages`` pages are free; False (changing nothing) if impossible."""
        need = num_pages * self.page_size
        available = self.cache.pool.available_tokens
        if need > available + self.cache.evictable_size:
            return False
        if need > available:
            self.evict(need - available)
        return True

    def _canonicalize(
        self, pages: list[PageId], node: TreeNode, first: int, end: int
    ) -> list[PageId]:
        """Switch ``pages[first:end]`` to the tree's pages on the path ending at ``node``.

        Returns:
            the replaced (duplicate) pages, deepest node first, for the caller to free.
        """
        dups: list[PageId] = []
        root = self.cache.root
        while end > first:
            assert node is not root, "radix path ended before the pages it must cover"
            value = node.value
            start = end - len(value)
            assert start >= 0, "radix node reaches past the pages it must cover"
            lo = max(start, first)
            if pages[lo:end] != value[lo - start :]:
                for i in range(lo, end):
                    if pages[i] != value[i - start]:
                        dups.append(pages[i])
                        pages[i] = value[i - start]
            end = start
            node = node.parent  # type: ignore[assignment]  # asserted not the root above
        return dups

    def _free_pages(self, pages: list[PageId]) -> None:
        if pages:
            self.cache.pool.free(pages)
            self._publish_removed(pages)

    def _publish_stored(
        self, local: list[PageHash], pages: list[PageId], end: int, first: int
    ) -> None:
        """Publish pages ``first:end`` not yet published, as one Stored event.

        Each page's sequence hash chains from its predecessor page's published
        hash. The event starts at the first hash no other page advertises;
        pages already published are skipped without breaking it.
        """
        events = self.events
        if events is None:
            return
        page_hash, refs = self._page_hash, self._hash_refs
        out: list[PageHash] = []
        parent: PageHash | None = None
        for i in range(first, end):
            page = pages[i]
            if page_hash[page] is not None:
                continue
            before = page_hash[pages[i - 1]] if i else None
            h = chain(before, local[i])
            page_hash[page] = h
            count = refs.get(h, 0) + 1
            refs[h] = count
            if out or count == 1:
                if not out:
                    parent = before
                out.append(h)
        if out:
            events.append(KvStored(parent, tuple(out)))

    def _publish_removed(self, pages: list[PageId]) -> None:
        """Publish the hashes whose last advertising page is among ``pages``."""
        if self.events is None or not pages:
            return
        page_hash, refs = self._page_hash, self._hash_refs
        gone: list[PageHash] = []
        for page in pages:
            h = page_hash[page]
            if h is None:
                continue
            page_hash[page] = None
            count = refs[h]
            if count > 1:
                refs[h] = count - 1
            else:
                del refs[h]
                gone.append(h)
        if gone:
            self.events.append(KvRemoved(tuple(gone)))

    def _check_lease(
        self, lease: RadixLease, tree: set[PageId], direct: dict[int, int]
    ) -> list[PageId]:
        """Check one lease; count its lock and return its private pages."""
        ps = self.page_size
        node = lease.last_node
        if node is None:
            assert not lease.pages and lease.num_tokens == lease.cached_tokens == 0, lease
            return []
        assert len(lease.pages) == -(-lease.num_tokens // ps), f"{lease} page count"
        assert lease.cached_tokens % ps == 0 and lease.cached_tokens <= lease.num_tokens, lease
        cached = lease.cached_tokens // ps
        if self.enable_prefix_caching:
            assert lease.pages[:cached] == self.cache.path_pages(node, cached), lease
        direct[id(node)] = direct.get(id(node), 0) + 1
        private = lease.pages[cached:]
        assert tree.isdisjoint(private), f"{lease} holds a tree page as its own"
        return private

    def _check_locks(self, direct: dict[int, int]) -> None:
        """Each node's lock count is the locks held at it or below it."""
        cache = self.cache
        order = list(cache.nodes())
        total: dict[int, int] = {}
        for node in reversed(order):
            below = sum(total[id(c)] for c in node.children.values())
            total[id(node)] = direct.get(id(node), 0) + below
            if node is not cache.root:
                assert node.lock_ref == total[id(node)], f"{node}: {total[id(node)]} locks held"

    def _check_hashes(self, free: list[PageId]) -> None:
        if self.events is None:
            return
        counts: dict[PageHash, int] = {}
        for h in self._page_hash:
            if h is not None:
                counts[h] = counts.get(h, 0) + 1
        assert counts == self._hash_refs, "per-hash page counts drifted"
        assert all(self._page_hash[p] is None for p in free), "a free page still advertises a hash"
