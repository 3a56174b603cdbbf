"""A host-memory (G2) KV tier of one DP rank: vLLM's ``OffloadingConnector`` CPU path.

Blocks are keyed by their sequence hash. Each is *pending* (its GPU-to-host
copy is under way) or *resident*, and a resident block may be *pinned* by
host-to-GPU loads reading it. Capacity counts both states.

**Recency.** Resident, unpinned blocks sit in an LRU. A lookup touches a
request's prompt blocks one by one in reverse logical order (so a prompt's
first block is the most recent); a completed copy touches its blocks as one
cohort, which the reference orders by sequence hash within the cohort. Eviction
takes the least recent first, skipping the blocks of the store that needs
the room.

**Transfers.** Two FIFO lanes, device-to-host (stores) and host-to-device
(loads): a copy starts at ``max(lane tail, not_before + latency)`` and takes
``blocks x block_bytes / (GB/s x 1e6)`` ms; 0 GB/s is instant. A store is
*prepared* during a pass (its blocks become pending at once) and submitted
on the lane at the pass end. Completions are taken in (deadline, stores before
loads, transfer id) order.

**Events.** With event lists, the tier publishes what a KV router may see:
a block stored (a completed store or disk read) and blocks evicted (when the
store that needs their room is prepared).

**Shared tier** (``scope: cluster_shared``): one tier for every rank of the
deployment that selects it (its *clients*). Copies then share bandwidth
(:class:`~servesim.engine.kv.fair_transfers.FairTransfers`: each client's own
link rate split among its copies, capped by the pool's shared rate split
among all copies), so their completion times are known only as the clock
advances. Completions are applied to the tier whichever client advances it,
and handed to the client that submitted them when it next looks. Its KV
events go to one time-stamped feed (:attr:`HostTier.feed`) that a router
applies to every client it routes to, once its time has come: a block is
stored when its copy completes, evicted when the store needing its room is
prepared.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from itertools import islice

from servesim.config import HostOffloadConfig
from servesim.engine.kv.block_pool import KvEvent, KvRemoved, KvStored
from servesim.engine.kv.fair_transfers import FairTransfers, bytes_per_ms

BlockKey = int
"""A block's sequence hash."""

RESIDENT = -1
"""The state of a block whose copy to host has completed (others hold their copy's id)."""


class Residency(IntEnum):
    """What a lookup finds for one block."""

    MISS = 0
    PENDING = 1
    HIT = 2


class Kind(IntEnum):
    """A transfer's direction; also the order of completions due at the same time."""

    STORE = 0
    LOAD = 1
    EXTERNAL = 2  # a block a disk tier is reading into this host tier


@dataclass(slots=True)
class Transfer:
    """One copy between GPU and host memory."""

    tid: int
    kind: Kind
    keys: list[BlockKey]
    owner: int  # the request's uid
    client: int = 0  # the rank that submitted it (a shared tier has several)
    deadline: float = math.inf  # set when submitted on a FIFO lane (unknown when shared)


class Lane:
    """A FIFO copy lane: each transfer starts when the previous one ends."""

    __slots__ = ("_bytes_per_ms", "latency_ms", "tail")

    def __init__(self, gbps: float, latency_ms: float) -> None:
        self._bytes_per_ms = gbps * 1e6
        self.latency_ms = latency_ms
        self.tail = 0.0

    def submit(self, not_before: float, nbytes: float) -> float:
        """Queue a copy that may start at ``not_before``; return when it ends."""
        start = max(self.tail, not_before + self.latency_ms)
        self.tail = start + (nbytes / self._bytes_per_ms if self._bytes_per_ms > 0 else 0.0)
        return self.tail


class _Lanes:
    """A rank's own copies: a FIFO lane each way, completion times known at submission."""

    def __init__(self, config: HostOffloadConfig) -> None:
        self._lanes = {
            Kind.STORE: Lane(config.d2h_bandwidth_gbps, config.latency_to_first_byte_ms),
            Kind.LOAD: Lane(config.h2d_bandwidth_gbps, config.latency_to_first_byte_ms),
        }
        self._due: list[tuple[float, int, int]] = []  # (deadline, kind, tid)

    def __bool__(self) -> bool:
        return bool(self._due)

    def submit(self, transfer: Transfer, not_before: float, nbytes: float) -> None:
        transfer.deadline = self._lanes[transfer.kind].submit(not_before, nbytes)
        heapq.heappush(self._due, (transfer.deadline, transfer.kind, transfer.tid))

    def next_event(self) -> float:
        return self._due[0][0] if self._due else math.inf

    def advance(self, now: float) -> list[tuple[int, float]]:
        """The copies due by ``now`` in (deadline, stores before loads, id) order."""
        due, done = self._due, []
        while due and due[0][0] <= now:
            at, _, tid = heapq.heappop(due)
            done.append((tid, at))
        return done


class _SharedLinks:
    """Copies of several clients sharing bandwidth (a cluster-shared tier)."""

    def __init__(self, config: HostOffloadConfig) -> None:
        # FairTransfers directions: 0 loads (host to GPU), 1 stores (GPU to host).
        self._fair = FairTransfers(
            (
                bytes_per_ms(config.shared_h2d_bandwidth_gbps),
                bytes_per_ms(config.shared_d2h_bandwidth_gbps),
            )
        )
        self._links: dict[int, tuple[float, float, float]] = {}  # client -> h2d, d2h, latency

    def __bool__(self) -> bool:
        return bool(self._fair)

    def join(self, client: int, config: HostOffloadConfig) -> None:
        self._links[client] = (
            bytes_per_ms(config.h2d_bandwidth_gbps),
            bytes_per_ms(config.d2h_bandwidth_gbps),
            config.latency_to_first_byte_ms,
        )

    def submit(self, transfer: Transfer, not_before: float, nbytes: float) -> None:
        h2d, d2h, latency = self._links[transfer.client]
        store = transfer.kind is Kind.STORE
        ready = max(not_before + latency, self._fair.now)
        self._fair.submit(
            transfer.tid, transfer.client, int(store), d2h if store else h2d, ready, nbytes
        )

    def next_event(self) -> float:
        return self._fair.next_event()

    def advance(self, now: float) -> list[tuple[int, float]]:
        return self._fair.advance(now)


class HostTier:
    """Host KV blocks of one rank, their LRU and the copies under way."""

    def __init__(
        self, config: HostOffloadConfig, block_bytes: int, *, events: list[KvEvent] | None = None
    ) -> None:
        self.capacity = config.num_host_blocks
        self.block_bytes = block_bytes
        self.shared = config.scope == "cluster_shared"
        self._events = events  # a private tier's (its rank's) KV events
        self.feed: list[tuple[float, KvEvent]] | None = None
        """A shared tier's KV events with the time each happened, in time order, once a
        router follows it (None: nobody does)."""
        # Each block held, resident or pending: RESIDENT, or the id of the copy bringing
        # it (plain ints, not an object a block: a busy tier stores and evicts hundreds of
        # thousands). Pinned blocks (resident, read by loads or disk writes) and their pin counts.
        self._state: dict[BlockKey, int] = {}
        self._pins: dict[BlockKey, int] = {}
        self._lru: dict[BlockKey, None] = {}  # resident and unpinned, least recent first
        # Bumped whenever a block becomes the most recent; a prompt touched again with
        # nothing made recent since then keeps its order (see touch_prompt).
        self._recency = 0
        self._last_prompt: tuple[list[BlockKey] | None, int] = (None, -1)
        self._links: _Lanes | _SharedLinks = _SharedLinks(config) if self.shared else _Lanes(config)
        self._transfers: dict[int, Transfer] = {}  # prepared or submitted, not completed
        self._prepared: dict[int, list[Transfer]] = {}  # per client, until its pass ends
        self._completed: dict[int, list[Transfer]] = {}  # per client, not yet taken
        self._next_tid = 0
        self.clock = 0.0
        """The latest time the tier was advanced to."""
        self.completion_epoch = 0
        """Copies completed so far, by any client (a waiter on another's copy looks again)."""

    def join(self, client: int, config: HostOffloadConfig) -> None:
        """A rank joins a shared tier with its own link rates."""
        assert isinstance(self._links, _SharedLinks)
        self._links.join(client, config)

    def _publish(self, event: KvEvent, at: float) -> None:
        if self.feed is not None:
            self.feed.append((at, event))
        elif self._events is not None:
            self._events.append(event)

    def progress(self, now: float) -> None:
        """Bring a shared tier to ``now`` (its feed then holds every event up to ``now``)."""
        self._progress(now)

    # ----- lookups -----

    def lookup(self, key: BlockKey) -> Residency:
        """Whether the block is on host, on its way there, or absent."""
        state = self._state.get(key)
        if state is None:
            return Residency.MISS
        return Residency.HIT if state == RESIDENT else Residency.PENDING

    def run_from(self, keys: list[BlockKey], start: int) -> tuple[list[BlockKey], bool]:
        """The blocks of ``keys`` from ``start`` on host, up to the first absent one, and
        whether any of them is still pending."""
        held = self._state
        end, pending = start, False
        for key in islice(keys, start, None):  # (not a copy: the walk stops at a miss)
            state = held.get(key)
            if state is None:
                break
            pending |= state != RESIDENT
            end += 1
        return keys[start:end], pending

    def absent(self, keys: list[BlockKey], start: int, end: int) -> list[int]:
        """Indices in ``start..end`` of the blocks of ``keys`` not on host (nor on their way)."""
        held = self._state
        return [i for i in range(start, end) if keys[i] not in held]

    def in_flight(self, tid: int) -> bool:
        """Whether a transfer is prepared or under way."""
        return tid in self._transfers

    def deadline(self, tid: int) -> float:
        """When a submitted transfer completes (``math.inf``: not known yet, or shared)."""
        return self._transfers[tid].deadline

    def next_deadline(self, client: int = 0) -> float:
        """When the client next has something to take: a copy's next event (any client's,
        on a shared tier), or now if completions wait for it (``math.inf``: none)."""
        if self._completed.get(client):
            return self.clock
        return self._links.next_event()

    def completed_for(self, client: int, tid: int) -> bool:
        """Whether a transfer of the client completed and waits to be taken."""
        return any(t.tid == tid for t in self._completed.get(client, ()))

    def occupancy(self) -> dict[str, int]:
        """Capacity and blocks held, resident or still being stored (the reference's
        ``g2_domains`` entry), once every copy under way has completed."""
        self._progress(math.inf)
        resident = sum(1 for state in self._state.values() if state == RESIDENT)
        return {
            "capacity_blocks": self.capacity,
            "resident_blocks": resident,
            "used_blocks": len(self._state),
        }

    def busy(self) -> bool:
        """Whether any copy is under way or waits to be taken."""
        return bool(self._links) or any(self._completed.values())

    def __len__(self) -> int:
        return len(self._state)

    def lru_order(self) -> list[BlockKey]:
        """Evictable blocks, next victim first (for tests)."""
        return list(self._lru)

    # ----- recency -----

    def touch(self, key: BlockKey) -> None:
        """Make a resident, unpinned block the most recent (no-op otherwise)."""
        if key in self._lru:
            del self._lru[key]
            self._lru[key] = None
            self._recency += 1

    def touched_last(self, keys: list[BlockKey]) -> bool:
        """Whether touching this prompt now would change nothing: it was the last one
        touched, and nothing became recent since (evictions only remove blocks, so its
        blocks are still in the order that touch left them)."""
        last, recency = self._last_prompt
        return last is keys and recency == self._recency

    def touch_prompt(self, keys: list[BlockKey]) -> None:
        """Touch a prompt's blocks last first (its first block ends up the most recent).

        A blocked request looks its prompt up every pass; the walk is skipped
        when it would change nothing (see :meth:`touched_last`).
        """
        if self.touched_last(keys):
            return
        lru = self._lru
        for key in reversed(keys):
            if key in lru:
                del lru[key]
                lru[key] = None
        self._recency += 1
        self._last_prompt = (keys, self._recency)

    def _touch_cohort(self, keys: Iterable[BlockKey]) -> None:
        """Blocks that became evictable together: most recent, ordered by key among themselves.

        Each caller passes blocks that were pending or pinned until now (a completed
        copy, a block's last pin dropped), so none is in the LRU yet.
        """
        self._recency += 1
        self._lru.update(dict.fromkeys(sorted(keys)))

    # ----- stores -----

    def prepare_store(
        self, keys: list[BlockKey], owner: int, client: int = 0, now: float = 0.0
    ) -> Transfer | None:
        """Make room for the blocks of ``keys`` not on host yet and mark them pending.

        Returns the prepared store, or None when eviction (never of ``keys``
        themselves, nor of pinned or pending blocks) cannot make room; the
        caller retries at a later pass. The caller checked that some are missing.
        """
        if self.shared:
            self._progress(now)
        held = self._state
        missing = list(dict.fromkeys([k for k in keys if k not in held]))
        if not self._make_room(len(missing), keys, now):
            return None
        transfer = Transfer(self._next_tid, Kind.STORE, missing, owner, client)
        self._next_tid += 1
        held.update(dict.fromkeys(missing, transfer.tid))
        self._transfers[transfer.tid] = transfer
        self._prepared.setdefault(client, []).append(transfer)
        return transfer

    def submit_prepared(self, now: float, client: int = 0) -> None:
        """Start copying the client's stores prepared during its pass that ends at ``now``."""
        prepared = self._prepared.pop(client, [])
        if prepared and self.shared:
            self._progress(now)
        for transfer in prepared:
            self._links.submit(transfer, now, len(transfer.keys) * self.block_bytes)

    # ----- the disk tier's side (servesim.engine.kv.disk_tier) -----

    def reserve_external(self, key: BlockKey, owner: int) -> Transfer | None:
        """Reserve a pending entry for a block a disk read will bring (None: no room)."""
        if not self._make_room(1, {key}, self.clock):
            return None
        transfer = Transfer(self._next_tid, Kind.EXTERNAL, [key], owner)
        self._next_tid += 1
        self._state[key] = transfer.tid
        self._transfers[transfer.tid] = transfer
        return transfer

    def can_reserve_prefix(self, keys: list[BlockKey]) -> bool:
        """Whether every block of ``keys`` missing here could be reserved at once (no side effect)."""
        wanted = set(keys)
        missing = sum(1 for key in wanted if key not in self._state)
        evictable = sum(1 for key in self._lru if key not in wanted)
        return missing <= self.capacity - len(self._state) + evictable

    def complete_external(self, tid: int) -> None:
        """A disk read landed: its reserved block is resident and most recent."""
        transfer = self._transfers.pop(tid)
        for key in transfer.keys:
            self._state[key] = RESIDENT
        self._touch_cohort(transfer.keys)
        self._publish(KvStored(None, tuple(transfer.keys), host=True), self.clock)

    def cancel_external(self, tid: int) -> None:
        """Drop a reservation whose disk read could not be submitted."""
        transfer = self._transfers.pop(tid)
        for key in transfer.keys:
            del self._state[key]

    def pin_external(self, keys: list[BlockKey]) -> None:
        """A disk write reads these resident blocks: they may not be evicted until it ends."""
        self._pin(keys)

    def unpin_external(self, keys: list[BlockKey]) -> None:
        """The disk write of these blocks ended."""
        self._touch_cohort(self._unpin(keys))

    def _pin(self, keys: list[BlockKey]) -> None:
        """One more pin on each of these resident blocks: out of the LRU until unpinned."""
        held, pins, lru = self._state, self._pins, self._lru
        for key in keys:
            assert held[key] == RESIDENT, "only a resident block is read (and pinned)"
            pins[key] = pins.get(key, 0) + 1
            lru.pop(key, None)

    def _unpin(self, keys: list[BlockKey]) -> list[BlockKey]:
        """Drop one pin of each block; return those no longer pinned."""
        pins, unpinned = self._pins, []
        for key in keys:
            left = pins[key] - 1
            if left:
                pins[key] = left
            else:
                del pins[key]
                unpinned.append(key)
        return unpinned

    def _make_room(self, count: int, protected: Iterable[BlockKey], now: float) -> bool:
        """Evict least recent blocks (never ``protected``) until ``count`` more fit."""
        need = count - (self.capacity - len(self._state))
        if need <= 0:
            return True
        keep = set(protected)
        victims = list(islice(self._lru, need))  # the least recent, when none is protected
        if not keep.isdisjoint(victims):
            victims = list(islice((key for key in self._lru if key not in keep), need))
        if len(victims) < need:
            return False
        lru, held = self._lru, self._state
        for key in victims:
            del lru[key]
            del held[key]
        self._publish(KvRemoved(tuple(victims), host=True), now)
        return True

    # ----- loads -----

    def schedule_load(
        self, keys: list[BlockKey], owner: int, not_before: float, client: int = 0
    ) -> Transfer:
        """Pin resident blocks and queue their copy to the GPU, starting no earlier than ``not_before``."""
        self._pin(keys)
        transfer = Transfer(self._next_tid, Kind.LOAD, list(keys), owner, client)
        self._next_tid += 1
        if self.shared:
            self._progress(not_before)
        self._links.submit(transfer, not_before, len(keys) * self.block_bytes)
        self._transfers[transfer.tid] = transfer
        return transfer

    # ----- completion -----

    def advance(self, now: float, client: int = 0) -> list[Transfer]:
        """Complete every transfer due by ``now``; return the client's, in completion order
        (a shared tier keeps the other clients' until they look)."""
        self._progress(now)
        return self._completed.pop(client, [])

    def _progress(self, now: float) -> None:
        """Apply every copy completed by ``now`` to the tier, whoever submitted it.

        A completed store's blocks become resident and recent; a completed
        load releases its pins (its blocks keep their host copy).
        """
        self.clock = max(self.clock, now)
        for tid, at in self._links.advance(now):
            transfer = self._transfers.pop(tid)
            self._completed.setdefault(transfer.client, []).append(transfer)
            self.completion_epoch += 1
            if transfer.kind is Kind.STORE:
                # Its blocks were pending under it until now (see check): all become resident.
                stored = transfer.keys
                self._state.update(dict.fromkeys(stored, RESIDENT))
                self._touch_cohort(stored)
                if stored:
                    self._publish(KvStored(None, tuple(stored), host=True), at)
            else:
                self._touch_cohort(self._unpin(transfer.keys))

    def check(self) -> None:
        """Assert the tier's invariants (tests call this after every step)."""
        held, pins = self._state, self._pins
        assert len(held) <= self.capacity, "host tier over capacity"
        assert all(count > 0 and held.get(key) == RESIDENT for key, count in pins.items()), (
            "a pinned host block is not resident, or its pin count is not positive"
        )
        evictable = {k for k, state in held.items() if state == RESIDENT and k not in pins}
        assert set(self._lru) == evictable, "host LRU is not the resident unpinned blocks"
        for key, state in held.items():
            if state != RESIDENT:
                transfer = self._transfers.get(state)
                assert transfer is not None and transfer.kind is not Kind.LOAD, (
                    f"pending host block {key} has no store or disk read under way"
                )
        for tid, transfer in self._transfers.items():
            if transfer.kind is not Kind.LOAD:  # (completion relies on it)
                assert all(held.get(key) == tid for key in transfer.keys), (
                    f"a block of copy {tid} to host is not pending under it"
                )
