"""The aggregated flow: a request is routed to one worker, which prefills and decodes it."""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

from servesim.cluster.runtime import Ledger, Pool
from servesim.engine.kv.block_pool import KvEvent, KvRemoved
from servesim.engine.request import EngineRequest, Status
from servesim.engine.worker import PassOutputs, ScheduledRemoval, Worker
from servesim.metrics.collector import RequestRecord, Terminal
from servesim.router.indexer import KvIndexer
from servesim.router.kv_router import RouteRequest
from servesim.router.routing import PlacementPolicy, RoundRobinPolicy, Routed
from servesim.workload.admission import Released
from servesim.workload.request import RequestSpec

if TYPE_CHECKING:
    from servesim.engine.kv.host_tier import HostTier

# Enum members read per request, as globals (a read through the class costs ~15x).
_FINISHED = Status.FINISHED
_COMPLETED, _REJECTED = Terminal.COMPLETED, Terminal.REJECTED


def route_request(
    uid: int, spec: RequestSpec, block_size: int, *, with_hashes: bool
) -> RouteRequest:
    """The router's view of a request: its size and the hashes of the blocks others may share."""
    prompt = spec.prompt
    hashes: list[int] = []
    if with_hashes:
        full = prompt.length // block_size
        shared = full if spec.shared_blocks is None else min(spec.shared_blocks, full)
        hashes = prompt.sequence_hashes(block_size, shared)
    isl = prompt.length
    return RouteRequest(uid, isl, -(-isl // block_size), hashes, spec.affinity_key)


class KvObserver:
    """Feeds a pool's KV events to an indexer, when the reference would make them visible.

    Events of a pass are observed at its end (as the reference shows them to
    its router); those of commands right after them. A fast-forward window is
    applied lazily, so the Removed events its evictions publish at the end of
    its passes are scheduled instead, and :meth:`catch_up` applies those due
    before the router reads the index.
    With ``lag_ms`` (``--kv-event-lag-ms``) every event reaches the index that
    much later: it is held until then, in the order it was published.

    A cluster-shared host tier's events (:meth:`follow`) come from the tier's
    own feed, time-stamped, and count for every target that joined it.
    """

    def __init__(self, indexer: KvIndexer, dp_size: int, *, lag_ms: float = 0.0) -> None:
        self.indexer = indexer
        self._dp = dp_size
        self._lag = lag_ms
        # (time it is due, kind: 0 events held back / 1 a scheduled removal, seq, worker, item)
        self._due: list[
            tuple[float, int, int, int, ScheduledRemoval | tuple[int, list[KvEvent]]]
        ] = []
        self._seq = 0
        self._workers: dict[int, Worker] = {}
        self._shared: list[tuple[HostTier, list[int]]] = []

    def follow(self, tier: HostTier, targets: list[int]) -> None:
        """Show the index a shared host tier's blocks on each of ``targets``."""
        tier.feed = []
        self._shared.append((tier, targets))

    def observe(self, worker: Worker, now: float) -> None:
        """Apply the worker's recorded events (or hold them back); schedule its window's removals."""
        base = worker.worker_id * self._dp
        for rank, events in worker.take_events():
            if self._lag:
                self._push(now + self._lag, worker.worker_id, (base + rank, events))
            else:
                self.indexer.apply(base + rank, events)
        for removal in worker.take_scheduled_removals():
            self._workers[worker.worker_id] = worker
            self._push(removal.at_ms + self._lag, worker.worker_id, removal)

    def catch_up(self, now: float) -> None:
        """Apply the scheduled removals of passes that ended by ``now`` (plus the lag),
        and the events held back until ``now`` or earlier."""
        for tier, targets in self._shared:
            tier.progress(now)
            feed = tier.feed
            assert feed is not None
            for at, event in feed:
                for target in targets:
                    if self._lag:
                        self._push(at + self._lag, -1, (target, [event]))
                    else:
                        self.indexer.apply(target, [event])
            feed.clear()
        due = self._due
        while due and due[0][0] <= now:
            _, _, _, worker_id, item = heapq.heappop(due)
            if isinstance(item, tuple):
                self.indexer.apply(*item)
            elif self._workers[worker_id].removal_happened(item):
                target = worker_id * self._dp + item.rank
                self.indexer.apply(target, [KvRemoved((item.block_hash,))])

    def _push(
        self, at: float, worker_id: int, item: ScheduledRemoval | tuple[int, list[KvEvent]]
    ) -> None:
        kind = 0 if isinstance(item, tuple) else 1
        heapq.heappush(self._due, (at, kind, self._seq, worker_id, item))
        self._seq += 1


class AggregatedFlow:
    """A placement policy (round robin or KV router) over one pool of aggregated workers.

    With a KV router, an observer feeds the workers' KV events to its indexer
    (see :class:`KvObserver`).
    """

    timers = False  # see Flow

    def __init__(
        self,
        pool: Pool,
        policy: PlacementPolicy,
        ledger: Ledger,
        *,
        block_size: int,
        observer: KvObserver | None = None,
    ) -> None:
        self.pools = [pool]
        self._pool = pool
        self._policy = policy
        self._ledger = ledger
        self._block_size = block_size
        self._observer = observer
        self._unplaced: dict[int, tuple[RequestSpec, RouteRequest]] = {}
        # Round robin places a request at once and reads nothing of it: admit builds
        # no router's view of it and no placement (about 9,500 instructions a request).
        self._rotation = policy.rotation if isinstance(policy, RoundRobinPolicy) else None

    def admit(self, record: RequestRecord, released: Released, now: float) -> None:
        """See :class:`~servesim.cluster.runtime.Flow`."""
        spec = released.spec
        if self._rotation is not None:
            worker, rank = self._rotation.place()
            self._submit(record, spec, worker, rank, now)
            return
        route = route_request(
            record.uid, spec, self._block_size, with_hashes=self._observer is not None
        )
        if self._observer is not None:
            self._observer.catch_up(now)
        self._unplaced[record.uid] = (spec, route)
        self._dispatch(self._policy.place(route, now, priority=spec.priority), now)

    def on_pass_start(
        self, pool: Pool, worker: Worker, admitted: list[tuple[EngineRequest, int]], now: float
    ) -> None:
        """See :class:`~servesim.cluster.runtime.Flow`."""
        ledger = self._ledger
        for request, reused in admitted:
            ledger.collector.on_admit(ledger.record(request.uid), now, reused, request.host_reused)
        if self._observer is not None:
            self._observer.observe(worker, now)

    def on_pass_end(self, pool: Pool, worker: Worker, outputs: PassOutputs, now: float) -> None:
        """See :class:`~servesim.cluster.runtime.Flow`."""
        ledger, policy = self._ledger, self._policy
        if outputs.prelude is not None:
            # The stepped pass the window followed (see ``chain`` in Worker), first, as of
            # its end: it ended no request, so its tokens are all it made visible.
            ledger.deliver_tokens(*outputs.prelude)
        ledger.deliver_tokens(outputs, now)
        observer = self._observer
        if observer is not None:
            observer.observe(worker, now)
            observer.catch_up(now)
        # Each request's signal in pass order, with the queue releases it triggers: a
        # first token completes a prefill, a last one ends the request.
        watched = policy.watches_progress
        emitted = outputs.emitted
        tokens: dict[EngineRequest, int] = {}
        if outputs.bursts:  # a request may have emitted several tokens in a row
            for request in emitted:
                tokens[request] = tokens.get(request, 0) + 1
            emitted = list(tokens)
        for request in emitted:
            finished = request.status is _FINISHED
            if watched:
                # As the reference reads its signals: a request's first signal, unless it
                # is also its last (a one-token burst that finishes), completes its prefill.
                burst = tokens.get(request, 1)
                first = ledger.record(request.uid).output_length == burst
                if first and (burst > 1 or not finished):
                    self._dispatch(policy.prefill_completed(request.uid, now), now)
            if finished:
                ledger.end(request.uid, now, _COMPLETED)
                if watched:
                    self._dispatch(policy.request_ended(request.uid, now), now)
        for request in outputs.finished:  # those that ended without a token of this pass
            if ledger.is_open(request.uid):
                # (At their last token when a window ran past it.)
                at = outputs.ended_at.get(request.uid, now)
                ledger.end(request.uid, at, _COMPLETED)
                if watched:
                    self._dispatch(policy.request_ended(request.uid, at), at)
        for request in outputs.rejected:
            ledger.end(request.uid, now, _REJECTED)
            if watched:
                self._dispatch(policy.request_ended(request.uid, now), now)

    def on_own_work(self, pool: Pool, worker: Worker, now: float) -> None:
        """See :class:`~servesim.cluster.runtime.Flow`: its KV events (host copies stored)."""
        if self._observer is not None:
            self._observer.observe(worker, now)

    def settle(self, now: float, *, workers_driven: bool) -> bool:
        """See :class:`~servesim.cluster.runtime.Flow`: nothing of its own."""
        return False

    def next_deadline(self) -> float:
        """See :class:`~servesim.cluster.runtime.Flow`: no timers of its own."""
        return math.inf

    def router_pending(self) -> tuple[int, int]:
        """See :class:`~servesim.cluster.runtime.Flow`: its one router counts as decode."""
        return 0, self._policy.pending

    def set_routable(self, pool: Pool, now: float) -> None:
        """See :class:`~servesim.cluster.runtime.Flow`: queued requests may go to new workers."""
        if self._observer is not None:
            self._observer.catch_up(now)
        self._dispatch(self._policy.set_routable(pool.routable(), now), now)

    def _dispatch(self, placed: list[Routed], now: float) -> None:
        for routed in placed:
            spec, route = self._unplaced.pop(routed.uid)
            record = self._ledger.record(routed.uid)
            record.queue_wait_ms = routed.queued_ms
            if self._observer is not None:
                record.selected_overlap_blocks = routed.overlap_blocks
                record.best_available_overlap_blocks = routed.best_overlap_blocks
                for window in self._ledger.windows:
                    window.on_routed(routed.overlap_blocks, route.blocks)
            self._submit(record, spec, routed.worker, routed.rank, now, route.hashes)

    def _submit(
        self,
        record: RequestRecord,
        spec: RequestSpec,
        worker: int,
        rank: int,
        now: float,
        hashes: list[int] | None = None,
    ) -> None:
        """Submit a placed request to ``worker``'s rank ``rank`` (``hashes``: of its
        prompt's blocks, as routing worked them out)."""
        self._ledger.collector.on_route(
            record, worker, rank, self._pool.workers[worker].config.dp_size
        )
        # (By position: keywords make a class call pack them into a dict its __init__
        # unpacks, see docs/architecture.md.)
        request = EngineRequest(
            record.uid, spec.prompt, spec.output_length, spec.shared_blocks, spec.sequence
        )
        if hashes:
            request.hashes = hashes.copy()
        self._pool.submit(worker, rank, request, now)
        if self._observer is not None:
            self._observer.observe(self._pool.workers[worker], now)
