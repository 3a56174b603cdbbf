"""The disaggregated flow: prefill on one pool, KV transfer, decode on another.

Each request gets a :class:`~servesim.cluster.handoff.HandoffCoordinator`
(source first, as vLLM): the flow carries out its actions against the pools
and feeds back their outcomes and the facts the engines report::

    arrival ─► SubmitPrefill: the prefill placement policy (round robin or KV
               router) picks a worker; a one-token (hidden) request prefills the prompt
    prefill pass end ─► SourceHeld: the prefill rank keeps the prompt's KV
    ReserveDestination: the decode policy picks a worker and rank; the rank
               queues the reservation (a prompt it can never hold is rejected)
               and grants its queue head, one per try: at once if its worker
               is idle, else at the end of the pass in flight (then at each
               later pass end and command, see DestinationRole.retry);
               a resident cached prefix is reused, the rest is transferable
    StartTransfer: the KV moves (fixed delay, or over shared links)
    ActivateDestination: waits for the decode rank's pass in flight to end;
               the request then joins the decode rank's queue, prebuilt
    ReleaseSource: waits for the prefill rank's pass in flight; frees the KV
    decode passes: every client-visible token; the last one ends the request

A command that must not disturb a pass in flight is deferred to that worker's
pass end and then runs before the pass's outputs are handled.

Both pools place requests by round robin over their (worker, DP rank) pairs,
worker-major (worker 0 rank 0, worker 0 rank 1, ..., worker 1 rank 0, ...),
as the reference's pool round robin does, or by the KV router over the same
targets.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from operator import itemgetter

from servesim.cluster.flows import KvObserver, route_request
from servesim.cluster.handoff import (
    Action,
    ActivateDestination,
    CancelDestination,
    CancelSource,
    Complete,
    DestinationReserved,
    Fact,
    Failed,
    HandoffCoordinator,
    HandoffOrder,
    HandoffPhase,
    Outcome,
    ReleaseSource,
    ReserveDestination,
    SourceHeld,
    StartTransfer,
    SubmitPrefill,
    TransferCompleted,
    TransferMode,
    TransferTiming,
)
from servesim.cluster.links import LinkModel, TransferLinks
from servesim.cluster.runtime import Ledger, Pool, Stage
from servesim.config import Backend, EngineConfig
from servesim.engine.request import EngineRequest
from servesim.engine.roles import DestinationRole, SourceRole
from servesim.engine.worker import PassOutputs, Worker
from servesim.metrics.collector import RequestRecord, Terminal
from servesim.router.kv_router import RouteRequest
from servesim.router.routing import PlacementPolicy, RoundRobinPolicy, Routed
from servesim.workload.admission import Released

_HANDOFF_ORDER = {
    Backend.VLLM: HandoffOrder.SOURCE_FIRST,
    Backend.TRTLLM: HandoffOrder.SOURCE_FIRST,
    Backend.SGLANG: HandoffOrder.DESTINATION_FIRST,
}

# Enum members read per request, as globals (a read through an enum class costs ~15x).
_SUBMITTED, _ACCEPTED, _SCHEDULED = Outcome.SUBMITTED, Outcome.ACCEPTED, Outcome.SCHEDULED
_APPLIED, _NOOP, _FAILED = Outcome.APPLIED, Outcome.NOOP, Outcome.FAILED
_COMPLETED, _REJECTED = Terminal.COMPLETED, Terminal.REJECTED
_FAILED_TERMINAL = Terminal.FAILED
_READY_DECODE = HandoffPhase.READY_DECODE


@dataclass(slots=True)
class _Handoff:
    """One request's way through the two pools."""

    record: RequestRecord
    released: Released
    coordinator: HandoffCoordinator
    prefill_at: tuple[int, int] | None = None  # (worker, rank)
    decode_at: tuple[int, int] | None = None
    prefill_request: EngineRequest | None = None
    decode_request: EngineRequest | None = None
    route: RouteRequest | None = None  # the prefill router's view, kept while it may queue
    submit_action: SubmitPrefill | None = None
    ended: bool = False  # the client saw its end (completed or rejected)


class DisaggregatedFlow:
    """Prefill pool, decode pool, their placement policies and the KV transfers between them.

    Round robin on both pools by default (:class:`~servesim.router.routing.RoundRobinPolicy`, worker-major);
    with a KV router, the prefill policy sees the prefill ranks' KV events
    and prefill load, and the decode policy balances decode load only.
    """

    timers = True  # transfers completing, queued handoff actions (see Flow)

    def __init__(
        self,
        prefill: Pool,
        decode: Pool,
        prefill_config: EngineConfig,
        decode_config: EngineConfig,
        ledger: Ledger,
        *,
        prefill_policy: PlacementPolicy | None = None,
        decode_policy: PlacementPolicy | None = None,
        observer: KvObserver | None = None,
    ) -> None:
        self.pools = [prefill, decode]
        self._prefill, self._decode = prefill, decode
        self._prefill_policy = prefill_policy or RoundRobinPolicy(
            [prefill_config.dp_size] * len(prefill.workers), worker_major=True
        )
        self._decode_policy = decode_policy or RoundRobinPolicy(
            [decode_config.dp_size] * len(decode.workers), worker_major=True
        )
        self._observer = observer  # of the prefill pool; decode workers publish no KV events
        self._block_size = prefill_config.block_size
        self._ledger = ledger
        self._prefill_config = prefill_config
        self._transfer_mode = TransferMode[prefill_config.kv_transfer_timing_mode.upper()]
        # SGLang reserves the destination before the prefill runs; vLLM and TRT-LLM after.
        self._order = _HANDOFF_ORDER[prefill_config.backend]
        self._handoffs: dict[int, _Handoff] = {}
        self._pending: deque[tuple[int, Action]] = deque()
        # Commands that found their worker's pass in flight, by worker: (rank, uid, action).
        self._deferred: dict[tuple[Stage, int], list[tuple[int, int, Action]]] = {}
        # The latest instant whose idle workers have had their chance to start a pass.
        self._driven_at = -math.inf
        self._fixed: list[tuple[float, int]] = []  # (transfer end, uid): fixed-delay transfers
        src_bw, dst_bw = prefill_config.kv_transfer_bandwidth, decode_config.kv_transfer_bandwidth
        receive = dst_bw / src_bw if src_bw and dst_bw else math.inf
        # Shared links price both ends; otherwise a transfer takes its delay at the source's
        # bandwidth, whatever the destination's (the reference's independent transfers).
        self._links = (
            TransferLinks(LinkModel.SHARED, receive)
            if src_bw and prefill_config.kv_transfer_link_model == "shared"
            else None
        )

    # ----- Flow protocol -----

    def admit(self, record: RequestRecord, released: Released, now: float) -> None:
        """See :class:`~servesim.cluster.runtime.Flow`: start the request's handoff.

        Its first action runs at the flow's next settle step: after the passes
        that can start at ``now`` have started, as in the reference (a decode
        worker that has just finished a pass is busy again when a request
        released at that instant asks it for a destination).
        """
        handoff = _Handoff(record, released, HandoffCoordinator(self._order))
        self._handoffs[record.uid] = handoff
        self._queue(record.uid, handoff.coordinator.start())

    def on_pass_start(
        self, pool: Pool, worker: Worker, admitted: list[tuple[EngineRequest, int]], now: float
    ) -> None:
        """See :class:`~servesim.cluster.runtime.Flow`."""
        collector = self._ledger.collector
        prefill = pool is self._prefill
        for request, reused in admitted:
            handoff = self._handoffs[request.uid]
            record = handoff.record
            if prefill:
                collector.on_admit(record, now, reused, request.host_reused)
                if record.prefill_admit_ms is None:
                    record.prefill_admit_ms = now
            elif record.decode_admit_ms is None:
                record.decode_admit_ms = now
                if handoff.coordinator.phase is _READY_DECODE:
                    handoff.coordinator.decode_admitted()
            else:
                # Re-admitted after a preemption on the decode rank, reusing cached KV.
                record.decode_reused_input_tokens = max(
                    record.decode_reused_input_tokens or 0, reused
                )
        if prefill:
            self._observe(worker, now)

    def on_own_work(self, pool: Pool, worker: Worker, now: float) -> None:
        """See :class:`~servesim.cluster.runtime.Flow`: the prefill pool's KV events; on a
        decode worker, a completed copy may admit a reservation refused while it ran."""
        if pool is self._prefill:
            self._observe(worker, now)
            return
        for rank in worker.ranks:
            self._grant(rank.role.retry(), now)

    def on_pass_end(self, pool: Pool, worker: Worker, outputs: PassOutputs, now: float) -> None:
        """See :class:`~servesim.cluster.runtime.Flow`."""
        # The reference queues a busy worker's commands per DP rank and applies them rank
        # by rank, each rank's in the order they came, at the pass end.
        deferred = self._deferred.pop((pool.stage, worker.worker_id), [])
        deferred.sort(key=itemgetter(0))
        self._pending.extend((uid, action) for _, uid, action in deferred)
        if pool is self._prefill:
            self._observe(worker, now)
            self._catch_up(now)
            self._prefill_ended(outputs, now)
        else:
            self._decode_ended(worker, outputs, now)

    def settle(self, now: float, *, workers_driven: bool) -> bool:
        """See :class:`~servesim.cluster.runtime.Flow`: transfers due now, then queued actions."""
        if workers_driven:
            self._driven_at = now
        done: list[int] = []
        while self._fixed and self._fixed[0][0] <= now:
            done.append(heapq.heappop(self._fixed)[1])
        if self._links is not None and self._links.next_completion_ms() <= now:
            done += self._links.advance(now)
        for uid in sorted(done):
            self._fact(uid, TransferCompleted())
        return self._drive(now) or bool(done)

    def next_deadline(self) -> float:
        """See :class:`~servesim.cluster.runtime.Flow`: the next transfer to finish."""
        fixed = self._fixed[0][0] if self._fixed else math.inf
        return min(fixed, self._links.next_completion_ms()) if self._links is not None else fixed

    def router_pending(self) -> tuple[int, int]:
        """See :class:`~servesim.cluster.runtime.Flow`."""
        return self._prefill_policy.pending, self._decode_policy.pending

    def set_routable(self, pool: Pool, now: float) -> None:
        """See :class:`~servesim.cluster.runtime.Flow`."""
        if pool is self._prefill:
            if self._observer is not None:
                self._observer.catch_up(now)
            self._dispatch_prefill(self._prefill_policy.set_routable(pool.routable(), now), now)
        else:
            released = self._decode_policy.set_routable(pool.routable(), now)
            assert not released, "destinations are placed when reserved, never queued"

    # ----- pass outputs -----

    def _prefill_ended(self, outputs: PassOutputs, now: float) -> None:
        timing = self._prefill_config
        policy = self._prefill_policy
        for request in outputs.finished:
            self._handoffs[request.uid].record.source_held_ms = now
            if policy.watches_progress:
                self._dispatch_prefill(policy.prefill_completed(request.uid, now), now)
            self._fact(
                request.uid,
                SourceHeld(
                    timing=TransferTiming(
                        mode=self._transfer_mode,
                        full_prompt_tokens=request.prompt_len,
                        kv_bytes_per_token=timing.kv_transfer_bytes_per_token,
                        bandwidth_gb_s=timing.kv_transfer_bandwidth,
                    )
                ),
            )
        for request in outputs.rejected:
            self._end(request.uid, now, _REJECTED)
            self._fact(request.uid, Failed(reason="the prefill rank rejected the prompt"))

    def _decode_ended(self, worker: Worker, outputs: PassOutputs, now: float) -> None:
        ledger = self._ledger
        ledger.deliver_tokens(outputs, now)
        for request in outputs.finished:
            self._decode_finished(request.uid, now, _COMPLETED)
        for request in outputs.rejected:
            self._decode_finished(request.uid, now, _REJECTED)
        # Each rank of the worker (idle ones too) tries its reservation queue once per pass end.
        for rank in worker.ranks:
            self._grant(rank.role.retry(), now)

    def _decode_finished(self, uid: int, now: float, terminal: Terminal) -> None:
        handoff = self._handoffs[uid]
        self._destination(handoff).forget(uid)
        handoff.coordinator.decode_finished()
        if self._decode_policy.watches_progress:
            self._decode_policy.request_ended(uid, now)
        self._end(uid, now, terminal)
        self._retire_if_done(uid)

    # ----- actions -----

    def _drive(self, now: float) -> bool:
        pending = self._pending
        driven = bool(pending)
        while pending:
            uid, action = pending.popleft()
            self._execute(uid, action, now)
        return driven

    def _execute(self, uid: int, action: Action, now: float) -> None:
        handoff = self._handoffs[uid]
        match action:
            case SubmitPrefill():
                self._submit_prefill(handoff, action, now)
            case ReserveDestination():
                self._reserve_destination(handoff, action, now)
            case StartTransfer(delay_ms=delay):
                self._outcome(uid, action, _SCHEDULED)
                self._start_transfer(handoff, delay, now)
            case ActivateDestination():
                self._activate(handoff, action, now)
            case ReleaseSource() | CancelSource():
                self._release_source(handoff, action, now)
            case CancelDestination():
                self._cancel_destination(handoff, action, now)
            case Complete():
                self._catch_up(now)
                if self._prefill_policy.watches_progress:
                    self._dispatch_prefill(self._prefill_policy.request_ended(uid, now), now)
                self._retire_if_done(uid)

    def _submit_prefill(self, handoff: _Handoff, action: SubmitPrefill, now: float) -> None:
        spec, uid = handoff.released.spec, handoff.record.uid
        route = route_request(uid, spec, self._block_size, with_hashes=self._observer is not None)
        self._catch_up(now)
        handoff.route = route
        handoff.submit_action = action
        self._dispatch_prefill(self._prefill_policy.place(route, now, priority=spec.priority), now)

    def _dispatch_prefill(self, placed: list[Routed], now: float) -> None:
        """Submit prefills the router placed (now, or released from its queue)."""
        for routed in placed:
            handoff = self._handoffs[routed.uid]
            spec, record = handoff.released.spec, handoff.record
            assert handoff.route is not None and handoff.submit_action is not None
            handoff.prefill_at = (routed.worker, routed.rank)
            record.prefill_worker = routed.worker
            dp_size = self._prefill.workers[routed.worker].config.dp_size
            record.prefill_worker_idx = routed.worker * dp_size + routed.rank
            record.queue_wait_ms = routed.queued_ms
            if self._observer is not None:
                record.selected_overlap_blocks = routed.overlap_blocks
                record.best_available_overlap_blocks = routed.best_overlap_blocks
                for window in self._ledger.windows:
                    window.on_routed(routed.overlap_blocks, handoff.route.blocks)
            # The prefill side computes the prompt and one hidden token; the decode side emits them all.
            request = EngineRequest(
                routed.uid,
                spec.prompt,
                min(spec.output_length, 1),
                shared_blocks=spec.shared_blocks
                if spec.prefill_shared_blocks is None
                else spec.prefill_shared_blocks,
            )
            request.hashes = handoff.route.hashes.copy()
            handoff.prefill_request = request
            # Brought to now as a handoff command is: stepping may have started its next pass.
            self._busy(self._prefill, routed.worker, now)
            self._prefill.submit(routed.worker, routed.rank, request, now)
            self._observe(self._prefill.workers[routed.worker], now)
            self._outcome(routed.uid, handoff.submit_action, _SUBMITTED)

    def _reserve_destination(
        self, handoff: _Handoff, action: ReserveDestination, now: float
    ) -> None:
        spec, uid = handoff.released.spec, handoff.record.uid
        if handoff.decode_at is None:
            route = RouteRequest(
                uid=uid,
                isl=spec.input_length,
                blocks=-(-spec.input_length // self._block_size),
                hashes=[],
            )
            (routed,) = self._decode_policy.place(route, now)
            worker, rank = routed.worker, routed.rank
            handoff.decode_at = (worker, rank)
            dp_size = self._decode.workers[worker].config.dp_size
            self._ledger.collector.on_route(handoff.record, worker, rank, dp_size)
            # The destination may reuse a prompt prefix resident on its rank: it
            # matches the prompt's shareable blocks, hashed as on the prefill side.
            request = EngineRequest(
                uid,
                spec.prompt,
                spec.output_length,
                shared_blocks=spec.shared_blocks,
                sequence=spec.sequence,
            )
            if handoff.prefill_request is not None:
                request.hashes = handoff.prefill_request.hashes.copy()
            handoff.decode_request = request
        assert handoff.decode_request is not None
        worker, rank = handoff.decode_at
        if self._decode.workers[worker].never_fits(rank, handoff.decode_request):
            # The reference's decode rank refuses the reservation (a command error): the
            # request fails, and its record names no decode worker (the dispatch was
            # aborted; round robin has moved on all the same).
            handoff.record.decode_worker_idx = None
            self._end(uid, now, _FAILED_TERMINAL)
            self._outcome(uid, action, _FAILED)
            return
        # The reference queues the reservation at once; it tries the queue then only if
        # the worker is idle, else at the end of the pass in flight.
        destination = self._destination(handoff)
        if self._busy(self._decode, worker, now):
            destination.enqueue(handoff.decode_request)
            self._decode.commanded(worker)
            self._outcome(uid, action, _ACCEPTED)
            return
        granted = destination.reserve(handoff.decode_request)
        self._decode.commanded(worker)
        # Granted or queued, the reservation changes what the idle rank may admit (a
        # queued one lets only prebuilt requests in): it tries again now.
        self._decode.wake(worker)
        self._outcome(uid, action, _ACCEPTED)
        self._grant(granted, now)

    def _grant(self, granted: tuple[EngineRequest, int, int] | None, now: float) -> None:
        """A decode rank reserved a destination: the request's transfer can start."""
        if granted is None:
            return
        request, _reused, transferable = granted
        record = self._handoffs[request.uid].record
        record.destination_reserved_ms = now
        # The reference reports no reused tokens for a destination, even when a resident
        # prefix saves part of the transfer (destination_missing moves only the rest).
        record.decode_reused_input_tokens = 0
        self._fact(request.uid, DestinationReserved(transferable_prompt_tokens=transferable))

    def _start_transfer(self, handoff: _Handoff, delay: float, now: float) -> None:
        uid = handoff.record.uid
        if delay <= 0:
            self._fact(uid, TransferCompleted())
        elif self._links is not None:
            assert handoff.prefill_at is not None and handoff.decode_at is not None
            self._links.submit(uid, handoff.prefill_at[0], handoff.decode_at[0], delay, now)
        else:
            heapq.heappush(self._fixed, (now + delay, uid))

    def _busy(self, pool: Pool, worker_id: int, now: float) -> bool:
        """Bring a worker to ``now`` before a command touches it; whether a pass is in flight.

        A fast-forward window cut at ``now`` can end with a pass ending exactly
        then. Stepped pass by pass, that pass would have ended at the start of
        this instant, before the first round of handoff actions ran (and before
        workers started their next passes), so it ends here and a command of
        that round finds the worker idle, as in the reference. A command of a
        later round (such as a request released at this instant asking for a
        destination) finds it busy with the next pass, which stepping started
        in between.
        """
        if not pool.settle_worker(worker_id, now, started=self._driven_at == now):
            return False
        worker = pool.workers[worker_id]
        if worker.busy_until != now:
            return True
        pool.wake(worker_id)
        self.on_pass_end(pool, worker, worker.finish_pass(), now)
        return False

    def _deferred_past_pass(
        self, pool: Pool, at: tuple[int, int], uid: int, action: Action, now: float
    ) -> bool:
        """Defer ``action`` on (worker, rank) ``at`` to the end of the worker's pass in flight,
        if there is one."""
        worker, rank = at
        if not self._busy(pool, worker, now):
            return False
        self._deferred.setdefault((pool.stage, worker), []).append((rank, uid, action))
        return True

    def _activate(self, handoff: _Handoff, action: ActivateDestination, now: float) -> None:
        assert handoff.decode_at is not None and handoff.decode_request is not None
        worker = handoff.decode_at[0]
        if self._deferred_past_pass(
            self._decode, handoff.decode_at, handoff.record.uid, action, now
        ):
            return
        destination = self._destination(handoff)
        destination.activate(handoff.decode_request)
        self._decode.commanded(worker)
        self._decode.wake(worker)
        handoff.record.destination_activated_ms = now
        self._outcome(handoff.record.uid, action, _APPLIED)
        self._grant(destination.retry(), now)

    def _release_source(
        self, handoff: _Handoff, action: ReleaseSource | CancelSource, now: float
    ) -> None:
        assert handoff.prefill_at is not None
        worker = handoff.prefill_at[0]
        if self._deferred_past_pass(
            self._prefill, handoff.prefill_at, handoff.record.uid, action, now
        ):
            return
        released = self._source(handoff).release(handoff.record.uid)
        self._prefill.commanded(worker)
        self._observe(self._prefill.workers[worker], now)
        if released:
            self._prefill.wake(worker)
            if isinstance(action, ReleaseSource):
                handoff.record.source_released_ms = now
        self._outcome(handoff.record.uid, action, _APPLIED if released else _NOOP)

    def _cancel_destination(self, handoff: _Handoff, action: CancelDestination, now: float) -> None:
        if handoff.decode_at is None or handoff.decode_request is None:
            self._outcome(handoff.record.uid, action, _NOOP)
            return
        worker = handoff.decode_at[0]
        if self._deferred_past_pass(
            self._decode, handoff.decode_at, handoff.record.uid, action, now
        ):
            return
        destination = self._destination(handoff)
        cancelled = destination.cancel(handoff.decode_request)
        self._decode.commanded(worker)
        self._outcome(handoff.record.uid, action, _APPLIED if cancelled else _NOOP)
        if cancelled:
            self._grant(destination.retry(), now)

    # ----- bookkeeping -----

    def _outcome(self, uid: int, action: Action, outcome: Outcome) -> None:
        self._queue(uid, self._handoffs[uid].coordinator.on_outcome(action.id, outcome))

    def _fact(self, uid: int, fact: Fact) -> None:
        self._queue(uid, self._handoffs[uid].coordinator.on_fact(fact))

    def _queue(self, uid: int, actions: list[Action]) -> None:
        self._pending.extend((uid, action) for action in actions)

    def _end(self, uid: int, now: float, terminal: Terminal) -> None:
        handoff = self._handoffs[uid]
        if not handoff.ended:
            handoff.ended = True
            # Sealed when the handoff retires: its source may be released after the end.
            self._ledger.end(uid, now, terminal, seal=False)

    def _retire_if_done(self, uid: int) -> None:
        handoff = self._handoffs[uid]
        if handoff.ended and handoff.coordinator.is_complete:
            del self._handoffs[uid]
            self._ledger.collector.seal(handoff.record)

    def _catch_up(self, now: float) -> None:
        if self._observer is not None:
            self._observer.catch_up(now)

    def _observe(self, worker: Worker, now: float) -> None:
        if self._observer is not None:
            self._observer.observe(worker, now)

    def _source(self, handoff: _Handoff) -> SourceRole:
        assert handoff.prefill_at is not None
        worker, rank = handoff.prefill_at
        return self._prefill.workers[worker].source(rank)

    def _destination(self, handoff: _Handoff) -> DestinationRole:
        assert handoff.decode_at is not None
        worker, rank = handoff.decode_at
        return self._decode.workers[worker].destination(rank)
