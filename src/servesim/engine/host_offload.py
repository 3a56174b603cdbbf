"""A vLLM rank's side of host offload: which prompt blocks it stores and loads, and when.

The rank's scheduler (:class:`~servesim.engine.vllm.VllmScheduler`) asks this
adapter at three points of a pass, as the reference's vLLM core asks its
``OffloadingConnector`` model:

- **Lookup** (waiting loop, after the GPU prefix match): the prompt blocks
  after the GPU hit that are on host, as one contiguous run. A run that
  includes a block still being stored, or being loaded for another request,
  defers the request until some transfer completes. Every lookup touches the
  prompt's host blocks in reverse order.
- **Load**: GPU blocks are reserved for the run (the request holds its GPU
  prefix and the new blocks) and the copy to GPU is queued, no earlier than
  the pending stores of the GPU blocks it overwrites. When it completes, the
  blocks become cached GPU blocks and the request is admitted at the next
  pass, reusing them.
- **Store** (after scheduling): a scheduled request's newly computed full
  prompt blocks that are not on host are prepared as one copy, submitted at
  the pass end. Until it completes, the GPU blocks it reads carry its id: a
  pass that reuses such a block for new tokens starts its compute only when
  the copy is done, and a load into it starts only then. The block keeps
  that id through its reuse: until the copy ends no store reads it, the
  request's own or another's that found it as a cached prefix. (Which
  position of an allocation gets such a block follows the reference's
  order, see :meth:`~servesim.engine.vllm.VllmScheduler._allocate`.)

Transfers complete at pass boundaries, or at their own deadline while the
rank is idle (the worker's engine-owned deadlines).

**Shared tier** (``scope: cluster_shared``): the rank is one client of the
deployment's tier. A store then *holds* its GPU source blocks (a reference
that keeps them active) until its copy completes, instead of tagging them; so
nothing is fenced. A copy completing on any client wakes this rank's
deferred requests.

**Disk tier** (optional, :mod:`servesim.engine.kv.disk_tier`): a completed
store is written on to disk, its host blocks pinned until the write ends; a
lookup first walks the run after the GPU hit and, for blocks the host lacks
but the disk has, reserves host entries and reads them in as one job (the
request is deferred until then, and then loads them from host as above).
A prefix larger than the host tier can thrash: each read evicts blocks the
request read in before, and it never loads. As the reference (aisimulate-core
0.13.0) bounds this, each lookup that submits a read is one *restore round*
of the request; the rounds reset whenever the rank schedules work, and after
:data:`RESTORE_ROUNDS_LIMIT` consecutive rounds the request stops reading
from disk until it is admitted or preempted (the disk tier counts a
``bypassed_restores``), so it computes what GPU and host do not hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servesim.config import HostOffloadConfig
from servesim.engine.kv.block_pool import BlockPool, KvEvent
from servesim.engine.kv.disk_tier import Direction, DiskTier, Probe
from servesim.engine.kv.host_tier import BlockKey, HostTier, Kind, Residency
from servesim.engine.request import EngineRequest
from servesim.engine.scheduler import Lookup

RESTORE_ROUNDS_LIMIT = 1024
"""Consecutive restore rounds of a stalled rank after which a request stops reading from disk."""


@dataclass(slots=True)
class _Load:
    """A host prefix being copied to the GPU (then *activated*: copied, not yet admitted)."""

    tid: int
    keys: list[BlockKey]
    base_blocks: int  # GPU prefix the request held before the load
    g1_tokens: int  # GPU prefix tokens found at lookup (for the reuse attribution)
    footprint_blocks: int  # blocks of the request's known sequence at lookup
    activated: bool = False

    @property
    def prefix_blocks(self) -> int:
        """GPU prefix the request holds once the load is done: its own plus the loaded blocks."""
        return self.base_blocks + len(self.keys)

    @property
    def tail_blocks(self) -> int:
        """Blocks the request will still need beyond its prefix."""
        return max(0, self.footprint_blocks - self.prefix_blocks)


@dataclass(slots=True)
class _RequestState:
    prompt_keys: list[BlockKey]
    next_store: int = 0  # prompt blocks before this one were offered to host
    latest_store: int | None = None
    load: _Load | None = None
    bypass_disk: bool = False  # gave up restoring from disk until admitted or preempted


class HostOffload:
    """One rank's host tier, the per-request offload state, and the GPU blocks being copied."""

    def __init__(
        self,
        config: HostOffloadConfig,
        block_size: int,
        bytes_per_token: int,
        *,
        events: list[KvEvent] | None = None,
    ) -> None:
        self.block_size = block_size
        self.config = config
        self.tier = HostTier(config, block_size * bytes_per_token, events=events)
        self._client = 0
        # With a shared tier: the rank's GPU pool, and the source blocks each store holds.
        self._gpu: BlockPool | None = None
        self._held: dict[int, list[int]] = {}
        self._seen_copies = 0
        self.disk: DiskTier | None = None
        self._worker = 0
        self._reads: dict[int, list[int]] = {}  # disk read job -> host reservations it fills
        self._tried_at = 0.0
        self._tried: set[tuple[int, BlockKey]] = set()  # (request, block) read at _tried_at
        self._restore_rounds: dict[int, int] = {}  # request uid -> rounds since the rank worked
        self._seen_epoch = 0
        self._states: dict[int, _RequestState] = {}
        self._loading_keys: dict[BlockKey, int] = {}  # key -> load transfer id
        self._loads: dict[int, EngineRequest] = {}  # load transfer id -> its request
        self._with_load: dict[int, _Load] = {}  # request uid -> its load (under way or done)
        # GPU blocks a store is still reading: block id -> the store's transfer id.
        self._copying: dict[int, int] = {}
        self._store_blocks: dict[int, list[int]] = {}
        self.reads_submitted = 0
        """Disk reads this rank's lookups submitted (a pass that submits one goes on at once)."""
        self.fence = 0.0
        """No pass computes before this: it reuses GPU blocks whose copy ends then."""

    def attach_shared(self, tier: HostTier, client: int, gpu: BlockPool) -> None:
        """Use the deployment's shared host tier as its client ``client``; stores hold
        their source blocks in ``gpu``."""
        assert tier.shared
        tier.join(client, self.config)
        self.tier, self._client, self._gpu = tier, client, gpu

    def attach_disk(self, disk: DiskTier, worker: int) -> None:
        """Put the deployment's disk tier under this host tier; ``worker`` names its pool."""
        self.disk = disk
        self._worker = worker

    # ----- per request -----

    def track(self, request: EngineRequest, prompt_keys: list[BlockKey]) -> None:
        """A request arrived; ``prompt_keys`` are its full prompt blocks' hashes."""
        self._states[request.uid] = _RequestState(prompt_keys)

    def forget(self, request: EngineRequest) -> None:
        """The request ended on this rank."""
        self._states.pop(request.uid, None)
        self._with_load.pop(request.uid, None)
        self._restore_rounds.pop(request.uid, None)

    def rank_worked(self) -> None:
        """The rank scheduled work: every request's restore rounds start again."""
        if self._restore_rounds:
            self._restore_rounds.clear()

    def load_of(self, request: EngineRequest) -> _Load | None:
        """The request's load, under way or activated."""
        return self._states[request.uid].load

    def stored(self, request: EngineRequest) -> bool:
        """Whether every full prompt block of the request was offered to host."""
        state = self._states[request.uid]
        return state.next_store >= len(state.prompt_keys)

    def idle(self) -> bool:
        """No copy is under way and no GPU block is being read by one."""
        return (
            not self._copying
            and not self._held
            and not self.tier.busy()
            and (self.disk is None or not self.disk.has_work(self._worker))
        )

    def reserved_blocks(self, request: EngineRequest) -> int:
        """GPU blocks a loading or activated request holds as its prefix."""
        load = self._states[request.uid].load
        return 0 if load is None else load.prefix_blocks

    def unreserved_tail(self, request: EngineRequest) -> int:
        """Blocks a loading or activated request will still need beyond its prefix."""
        load = self._states[request.uid].load
        return 0 if load is None else load.tail_blocks

    def unreserved_tails(self) -> int:
        """:meth:`unreserved_tail` summed over the rank's requests."""
        return sum(load.tail_blocks for load in self._with_load.values())

    # ----- the waiting loop -----

    def lookup(
        self, request: EngineRequest, g1_blocks: int, now: float
    ) -> tuple[Lookup, list[BlockKey]]:
        """The host run after the request's ``g1_blocks`` cached GPU blocks.

        Returns (MISS or DEFERRED, []) or (HIT, the run's keys).
        """
        state = self._states[request.uid]
        if state.load is not None:
            return (Lookup.MISS, []) if state.load.activated else (Lookup.DEFERRED, [])
        tier = self.tier
        if state.latest_store is not None:
            if tier.in_flight(state.latest_store):
                return Lookup.DEFERRED, []
            state.latest_store = None
        keys = state.prompt_keys
        outcome: tuple[Lookup, list[BlockKey]] = (Lookup.MISS, [])
        disk = self.disk
        restoring = g1_blocks < len(keys) and disk is not None and not state.bypass_disk
        if restoring and self._restore_rounds.get(request.uid, 0) >= RESTORE_ROUNDS_LIMIT:
            assert disk is not None
            disk.count_bypass()
            state.bypass_disk, restoring = True, False
            del self._restore_rounds[request.uid]
        if restoring and self._stage(request, keys[g1_blocks:], now):
            outcome = (Lookup.DEFERRED, [])
        elif g1_blocks < len(keys):
            run, deferred = tier.run_from(keys, g1_blocks)
            if run and (deferred or self.loading_any(run)):
                outcome = (Lookup.DEFERRED, [])
            elif run:
                outcome = (Lookup.HIT, run)
        tier.touch_prompt(keys)
        return outcome

    def _stage(self, request: EngineRequest, keys: list[BlockKey], now: float) -> bool:
        """Read into host the blocks of ``keys`` it lacks but the disk has, up to the first
        block neither has; return whether the request must wait for a transfer."""
        disk, tier, worker = self.disk, self.tier, self._worker
        assert disk is not None
        if now > self._tried_at:
            self._tried_at = now
            self._tried.clear()
        missing: list[BlockKey] = []
        reservations: list[int] = []
        deferred = False
        for key in keys:
            found = tier.lookup(key)
            if found is Residency.HIT:
                continue
            if found is Residency.PENDING:
                deferred = True
                continue
            probe = disk.probe(worker, key)
            if probe is Probe.PENDING:
                deferred = True
                continue
            if probe is Probe.MISS:
                break
            if (request.uid, key) in self._tried:
                # Read in already at this instant and evicted since: go on only if the
                # whole recoverable prefix can fit now.
                prefix = []
                for k in keys:
                    if tier.lookup(k) is Residency.MISS and not disk.contains(worker, k):
                        break
                    prefix.append(k)
                if not tier.can_reserve_prefix(prefix):
                    break
            reservation = tier.reserve_external(key, request.uid)
            if reservation is None:
                break
            missing.append(key)
            reservations.append(reservation.tid)
        if not missing:
            return deferred
        job = disk.submit(worker, Direction.READ, missing, now)
        if job is None:
            for tid in reservations:
                tier.cancel_external(tid)
            return deferred
        self._tried.update((request.uid, key) for key in missing)
        self._reads[job.jid] = reservations
        self.reads_submitted += 1
        self._restore_rounds[request.uid] = self._restore_rounds.get(request.uid, 0) + 1
        return True

    def touched_last(self, request: EngineRequest) -> bool:
        """Whether looking the request up now would touch its host blocks as they are:
        its prompt was the last one touched, and nothing became recent since."""
        return self.tier.touched_last(self._states[request.uid].prompt_keys)

    def loading_any(self, keys: list[BlockKey]) -> bool:
        """Whether another request's load is copying one of these blocks."""
        return not self._loading_keys.keys().isdisjoint(keys)

    def start_load(
        self,
        request: EngineRequest,
        keys: list[BlockKey],
        base_blocks: int,
        now: float,
    ) -> None:
        """Queue the copy of ``keys`` into the GPU blocks the request just reserved after its prefix."""
        not_before = now
        for block in request.blocks[base_blocks:]:
            tid = self._copying.get(block)
            if tid is not None:
                not_before = max(not_before, self.tier.deadline(tid))
        transfer = self.tier.schedule_load(keys, request.uid, not_before, self._client)
        for key in keys:
            self._loading_keys[key] = transfer.tid
        self._loads[transfer.tid] = request
        load = _Load(
            transfer.tid,
            keys,
            base_blocks,
            base_blocks * self.block_size,
            -(-request.length // self.block_size),
        )
        self._states[request.uid].load = self._with_load[request.uid] = load

    def on_admitted(self, request: EngineRequest, reused_tokens: int) -> int:
        """The request was admitted reusing ``reused_tokens``; return those that came from host."""
        state = self._states[request.uid]
        load, state.load = state.load, None
        state.bypass_disk = False
        self._restore_rounds.pop(request.uid, None)
        if load is None:
            return 0
        del self._with_load[request.uid]
        assert load.activated, "a request is admitted only once its load is done"
        state.next_store = reused_tokens // self.block_size
        return reused_tokens - min(load.g1_tokens, reused_tokens)

    # ----- stores -----

    def observe_computed(self, request: EngineRequest, now: float) -> None:
        """Offer the request's newly computed full prompt blocks to host (after scheduling).

        The blocks not on host are stored as one copy, unless one of their
        GPU blocks is still being read by another store (tried again at a
        later pass) or host eviction cannot make room.
        """
        state = self._states[request.uid]
        keys = state.prompt_keys
        end = min(min(request.num_computed, request.prompt_len) // self.block_size, len(keys))
        start = state.next_store
        if end <= start:
            return
        tier = self.tier
        missing = tier.absent(keys, start, end)
        if not missing:
            state.next_store = end
            return
        sources = [request.blocks[i] for i in missing]
        if self.copying_any(sources):
            return
        transfer = tier.prepare_store(keys[start:end], request.uid, self._client, now)
        if transfer is None:
            return
        if self._gpu is not None:
            self._gpu.hold(sources)
            self._held[transfer.tid] = sources
        else:
            self._copying.update(dict.fromkeys(sources, transfer.tid))
            self._store_blocks[transfer.tid] = sources
        state.latest_store = transfer.tid
        state.next_store = end
        tier.touch_prompt(keys)

    def copying_any(self, blocks: list[int]) -> bool:
        """Whether a store to host is still reading one of these GPU blocks."""
        return not self._copying.keys().isdisjoint(blocks)

    def fence_allocation(self, blocks: list[int]) -> None:
        """The new ``blocks`` of one allocation: its compute waits for the stores still
        reading any of them. Each such block stays tagged with its store until the copy
        ends, so no store to host reads it meanwhile (see :meth:`observe_computed`): the
        reference's G1 pool lets the pending read follow the capacity into the new copy
        (``can_attach_source_reuse_dependency`` fails for that copy alone); the
        allocation's other blocks may be stored at once."""
        if not self.copying_any(blocks):  # (mostly: a block being stored is rarely reused)
            return
        copying, tier = self._copying, self.tier
        for block in blocks:
            tid = copying.get(block)
            if tid is not None:
                self.fence = max(self.fence, tier.deadline(tid))

    def on_preempted(self, request: EngineRequest) -> None:
        """vLLM flushes a preempted request's store before its blocks are freed; the
        request may restore from disk again."""
        state = self._states[request.uid]
        state.bypass_disk = False
        self._restore_rounds.pop(request.uid, None)
        tid = state.latest_store
        if tid is not None and self.tier.in_flight(tid):
            deadline = self.tier.deadline(tid)
            if math.isfinite(deadline):
                self.fence = max(self.fence, deadline)

    # ----- transfer completion -----

    def advance(self, now: float) -> tuple[list[EngineRequest], bool]:
        """Complete the transfers due by ``now``.

        Returns the requests whose load completed (the caller makes their
        blocks cached and marks them activated) and whether any transfer completed.
        """
        tier = self.tier
        done = tier.advance(now, self._client)
        loaded: list[EngineRequest] = []
        disk = self.disk
        for transfer in done:
            if transfer.kind is Kind.STORE and self._gpu is not None:
                self._gpu.release(self._held.pop(transfer.tid))
            elif transfer.kind is Kind.STORE:
                for block in self._store_blocks.pop(transfer.tid):
                    if self._copying.get(block) == transfer.tid:
                        del self._copying[block]
                if disk is not None:
                    job = disk.submit(self._worker, Direction.WRITE, transfer.keys, now)
                    if job is not None:
                        self.tier.pin_external(job.keys)
        # On a shared tier, another client's copy completing may unblock a request here.
        progressed = bool(done) or tier.completion_epoch != self._seen_copies
        self._seen_copies = tier.completion_epoch
        if disk is not None:
            finished = disk.take_completed(self._worker, now)
            progressed |= bool(finished) or disk.completion_epoch != self._seen_epoch
            self._seen_epoch = disk.completion_epoch
            for job in finished:
                if job.direction is Direction.WRITE:
                    self.tier.unpin_external(job.keys)
                else:
                    for tid in self._reads.pop(job.jid):
                        self.tier.complete_external(tid)
        for transfer in done:
            if transfer.kind is Kind.LOAD:
                for key in transfer.keys:
                    del self._loading_keys[key]
                request = self._loads.pop(transfer.tid)
                load = self._states[request.uid].load
                assert load is not None and load.tid == transfer.tid
                load.activated = True
                loaded.append(request)
        return loaded, progressed

    def boundary(self, now: float) -> tuple[list[EngineRequest], bool]:
        """A pass ended at ``now``: complete what is due, submit its stores, settle instant ones."""
        loaded, progressed = self.advance(now)
        self.tier.submit_prepared(now, self._client)
        more, again = self.advance(now)
        return loaded + more, progressed or again

    def next_deadline(self) -> float:
        """When the next transfer completes (``math.inf`` if none is under way)."""
        tier = self.tier
        if tier.completion_epoch != self._seen_copies:
            return tier.clock  # another client's copy completed: look again
        at = tier.next_deadline(self._client)
        disk = self.disk
        if disk is not None:
            if disk.completion_epoch != self._seen_epoch:
                return disk.now  # another worker's transfer completed: look again
            at = min(at, disk.next_deadline(self._worker))
        return at

    def check(self) -> None:
        """Assert the tier's invariants and that every copy source is a live store's."""
        self.tier.check()
        if self.disk is not None:
            self.disk.check()
        for block, tid in self._copying.items():
            assert self.tier.in_flight(tid), f"GPU block {block} is tagged by a finished store"
        for tid in self._held:
            assert self.tier.in_flight(tid) or self.tier.completed_for(self._client, tid), (
                f"store {tid} holds GPU blocks after it completed"
            )

    def held_blocks(self) -> list[list[int]]:
        """The GPU blocks each store under way holds (a shared tier), as block tables."""
        return list(self._held.values())
