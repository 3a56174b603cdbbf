"""The replay runtime: one loop, one clock, for aggregated and disaggregated flows.

Virtual time is in ms. At each timestamp the runtime settles everything that
becomes possible at that instant, in a fixed order, until nothing changes:

1. pass ends due now, by (stage, worker id) with stages aggregated < prefill
   < decode: their outputs go to the flow; then idle workers' own work due now
   (KV copies to and from a host tier completing);
2. the flow's own work due now (KV transfers, handoff actions);
3. arrivals ready now (including turns unlocked by step 1): the flow routes them;
4. idle workers with work start a pass, prefill pool before decode pool,
   lowest worker id first;

then jumps to the next timestamp: the earliest pass end, arrival, flow
deadline or idle worker's own deadline. A pass is decided at its start; its outputs become visible at its end.

What happens to a request between arrival and its end is the *flow*'s
business (:mod:`servesim.cluster.flows`); the runtime owns the clock, the
pools' pass lifecycle and the ledger of requests in flight.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from servesim.engine.request import EngineRequest
from servesim.engine.worker import PassOutputs, Worker
from servesim.errors import SimulationError
from servesim.metrics.collector import Collector, RequestRecord, Terminal
from servesim.workload.admission import Admission, Released

ProgressHook = Callable[[int], None]


class Stage(IntEnum):
    """A pool's role; also the order of same-instant pass ends."""

    AGGREGATED = 0
    PREFILL = 1
    DECODE = 2


class Pool:
    """The workers of one stage, and which of them may start a pass.

    Pass ends go on the runtime's heap as ``(end, stage, worker id)``; an entry
    whose worker is no longer busy until that end (its window was cut short)
    is stale and skipped.
    """

    def __init__(
        self, stage: Stage, workers: list[Worker], completions: list[tuple[float, int, int]]
    ) -> None:
        self.stage = stage
        self.workers = workers
        self._completions = completions
        # Workers whose state changed since they last tried to start a pass (a
        # submit or a pass end): only they can start one, so the settle loop
        # never scans idle workers.
        self.wakeable: set[int] = set()

    def submit(self, worker_id: int, rank: int, request: EngineRequest, now: float) -> None:
        """Queue a request on a worker's rank."""
        self._rescheduled(worker_id, self.workers[worker_id].submit(rank, request, now))
        self.wakeable.add(worker_id)

    def settle_worker(self, worker_id: int, now: float) -> bool:
        """Bring a worker's state to ``now`` before a command touches it.

        Returns:
            Whether a pass is in flight (a command that must not disturb it
            waits for its end).
        """
        worker = self.workers[worker_id]
        self._rescheduled(worker_id, worker.cut(now))
        return worker.busy

    def wake(self, worker_id: int) -> None:
        """Something changed a worker's state: let it try to start a pass at the next opportunity."""
        self.workers[worker_id].stalled = False
        self.wakeable.add(worker_id)

    def schedule_end(self, worker_id: int, end: float) -> None:
        """Put a worker's pass end on the heap."""
        heapq.heappush(self._completions, (end, self.stage, worker_id))

    def _rescheduled(self, worker_id: int, end: float | None) -> None:
        if end is not None:
            self.schedule_end(worker_id, end)


class Ledger:
    """Requests in flight: their records, how the workload released them, and their end."""

    def __init__(
        self, collector: Collector, admission: Admission, progress: ProgressHook | None
    ) -> None:
        self.collector = collector
        self._admission = admission
        self._progress = progress
        self._records: dict[int, RequestRecord] = {}
        self._released: dict[int, Released] = {}
        self._ended = 0

    def open(self, record: RequestRecord, released: Released) -> None:
        """A request entered the cluster."""
        self._records[record.uid] = record
        self._released[record.uid] = released

    def record(self, uid: int) -> RequestRecord:
        """The record of a request in flight."""
        return self._records[uid]

    def is_open(self, uid: int) -> bool:
        """Whether the request is in flight (entered and not ended)."""
        return uid in self._records

    def deliver_tokens(self, outputs: PassOutputs, now: float) -> None:
        """Client-visible tokens of a pass (or window) that ended at ``now``."""
        records, collector = self._records, self.collector
        for requests, at in outputs.seconds:
            for request in requests:
                collector.on_second_token(records[request.uid], now if at is None else at)
        for request, tokens, last_ms in outputs.catch_ups:
            collector.on_catch_up(records[request.uid], tokens, last_ms)
        for prev_end, count, times in outputs.cohorts:
            if times is None:
                collector.on_shared_gap(now - prev_end, count)
            else:
                collector.on_shared_gaps(prev_end, count, times)
        on_token = collector.on_token
        for request in outputs.emitted:
            on_token(records[request.uid], now)

    def end(self, uid: int, now: float, terminal: Terminal) -> None:
        """The request completed or was rejected at ``now``; its session may go on."""
        record = self._records.pop(uid)
        self.collector.on_terminal(record, now, terminal)
        self._admission.on_finished(self._released.pop(uid), now)
        self._ended += 1
        if self._progress is not None:
            self._progress(self._ended)

    @property
    def in_flight(self) -> int:
        """Requests that entered and have not ended."""
        return len(self._records)


class Flow(Protocol):
    """What happens to a request between arrival and its end."""

    pools: list[Pool]

    def admit(self, record: RequestRecord, released: Released, now: float) -> None:
        """A request arrived: route it and hand it to a worker (or start its handoff)."""
        ...

    def on_pass_start(
        self, pool: Pool, worker: Worker, admitted: list[tuple[EngineRequest, int]], now: float
    ) -> None:
        """A worker started a pass that admitted ``admitted`` (request, reused tokens)."""
        ...

    def on_pass_end(self, pool: Pool, worker: Worker, outputs: PassOutputs, now: float) -> None:
        """A worker's pass (or window) ended at ``now`` with ``outputs``."""
        ...

    def on_own_work(self, pool: Pool, worker: Worker, now: float) -> None:
        """An idle worker did work of its own at ``now`` (such as completing a KV copy)."""
        ...

    def settle(self, now: float) -> bool:
        """Do the flow's own work due at ``now``; return whether anything changed."""
        ...

    def next_deadline(self) -> float:
        """When the flow next has work of its own (``math.inf`` if none)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutcome:
    """How the loop ended, and the worker-seconds each stage was provisioned for."""

    final_ms: float
    time_limited: bool
    worker_seconds: dict[Stage, float]


class Runtime:
    """Drives the flow, its pools and the admission queue through virtual time."""

    def __init__(
        self,
        flow: Flow,
        admission: Admission,
        ledger: Ledger,
        completions: list[tuple[float, int, int]],
    ) -> None:
        self.flow = flow
        self.admission = admission
        self.ledger = ledger
        self.now = 0.0
        self._completions = completions
        self._pools = {pool.stage: pool for pool in flow.pools}
        self._worker_seconds = dict.fromkeys(self._pools, 0.0)
        # Idle workers' own deadlines (engine-owned work: KV copies completing), as
        # (time, stage, worker id); _wakes holds the one pushed last for each worker.
        self._own_work = any(
            w.config.native_host_offload is not None for p in flow.pools for w in p.workers
        )
        self._deadlines: list[tuple[float, int, int]] = []
        self._wakes: dict[tuple[int, int], float] = {}

    def run(self, max_sim_time_ms: float | None = None) -> RunOutcome:
        """Run until every request has ended (or the next timestamp passes the cap)."""
        self._settle()
        while True:
            upcoming = min(
                self.admission.next_ready_ms(self.now),
                self._completions[0][0] if self._completions else math.inf,
                self._deadlines[0][0] if self._deadlines else math.inf,
                self.flow.next_deadline(),
            )
            if upcoming == math.inf:
                break
            if max_sim_time_ms is not None and upcoming > max_sim_time_ms:
                self._deliver_windows_up_to(max_sim_time_ms)
                return self._outcome(time_limited=True)
            self._advance(upcoming)
            self._settle()
        if self.ledger.in_flight or not self.admission.drained():
            raise SimulationError(
                f"simulation reached a dead end at {self.now:.3f} ms with {self.ledger.in_flight} "
                "request(s) that can never finish (a preempted sequence may have outgrown the KV cache)"
            )
        return self._outcome(time_limited=False)

    def _advance(self, upcoming: float) -> None:
        # Cost integrates the provisioned workers over each clock advance, step by step.
        dt = (upcoming - self.now) / 1000.0
        for stage, pool in self._pools.items():
            self._worker_seconds[stage] += dt * len(pool.workers)
        self.now = upcoming

    def _outcome(self, *, time_limited: bool) -> RunOutcome:
        self.ledger.collector.committed_prefill_tokens = sum(
            rank.committed_prefill_tokens
            for pool in self._pools.values()
            for worker in pool.workers
            for rank in worker.ranks
        )
        return RunOutcome(
            final_ms=self.now, time_limited=time_limited, worker_seconds=dict(self._worker_seconds)
        )

    # ----- settle loop -----

    def _settle(self) -> None:
        now = self.now
        completions, admission, pools = self._completions, self.admission, self.flow.pools
        while True:
            # Each step is skipped when a look shows it has nothing to do (the last
            # round, which confirms that nothing changed, is most of them).
            changed = (
                bool(completions) and completions[0][0] == now and self._apply_completions(now)
            )
            if self._deadlines and self._deadlines[0][0] == now:
                changed |= self._apply_own_work(now)
            changed |= self.flow.settle(now)
            if admission.next_ready_ms(now) <= now:
                changed |= self._release_arrivals(now)
            if any(pool.wakeable for pool in pools):
                changed |= self._start_passes(now)
            if not changed:
                return

    def _apply_completions(self, now: float) -> bool:
        completions = self._completions
        changed = False
        while completions and completions[0][0] == now:
            _, stage, worker_id = heapq.heappop(completions)
            pool = self._pools[Stage(stage)]
            worker = pool.workers[worker_id]
            if worker.busy_until != now:
                continue  # stale: its fast-forward window was cut to end earlier
            pool.wake(worker_id)
            self.flow.on_pass_end(pool, worker, worker.finish_pass(), now)
            changed = True
        return changed

    def _apply_own_work(self, now: float) -> bool:
        deadlines, changed = self._deadlines, False
        while deadlines and deadlines[0][0] == now:
            _, stage, worker_id = heapq.heappop(deadlines)
            if self._wakes.get((stage, worker_id)) == now:
                del self._wakes[stage, worker_id]
            pool = self._pools[Stage(stage)]
            worker = pool.workers[worker_id]
            if worker.busy or worker.next_internal_deadline() > now:
                continue  # a pass is in flight (its end completes what is due), or done already
            worker.process_internal(now)
            self.flow.on_own_work(pool, worker, now)
            pool.wake(worker_id)
            changed = True
        return changed

    def _watch_own_work(self, pool: Pool, worker_id: int) -> None:
        """An idle worker: make sure the loop wakes it at its own next deadline."""
        at = pool.workers[worker_id].next_internal_deadline()
        key = (pool.stage, worker_id)
        if at < math.inf and self._wakes.get(key) != at:
            self._wakes[key] = at
            heapq.heappush(self._deadlines, (at, pool.stage, worker_id))

    def _release_arrivals(self, now: float) -> bool:
        released = self.admission.release(now)
        collector = self.ledger.collector
        for item in released:
            spec = item.spec
            record = collector.on_arrival(
                spec.input_length,
                spec.output_length,
                item.arrival_ms,
                spec.session_id,
                spec.turn_index,
                request_id=spec.request_id,
                play_id=spec.trajectory,
                agentic=spec.agentic,
            )
            self.ledger.open(record, item)
            self.flow.admit(record, item, now)
        return bool(released)

    def _start_passes(self, now: float) -> bool:
        started = False
        for pool in self.flow.pools:
            if not pool.wakeable:
                continue
            wakeable = sorted(pool.wakeable)  # lowest worker id first
            pool.wakeable.clear()
            for worker_id in wakeable:
                started |= self._start_pass(pool, worker_id, now)
        return started

    def _start_pass(self, pool: Pool, worker_id: int, now: float) -> bool:
        worker = pool.workers[worker_id]
        if not worker.can_start():
            if self._own_work and not worker.busy:
                self._watch_own_work(pool, worker_id)
            return False
        begun = worker.start_pass(now)
        if begun is None:
            if self._own_work:
                self._watch_own_work(pool, worker_id)
            return False
        end, admitted = begun
        self.flow.on_pass_start(pool, worker, admitted, now)
        if end > now:
            pool.schedule_end(worker_id, end)
        else:
            pool.wake(worker_id)
            self.flow.on_pass_end(pool, worker, worker.finish_pass(), now)
        return True

    def _deliver_windows_up_to(self, limit: float) -> None:
        """At a time cap, make visible the fast-forwarded tokens stamped by ``limit``."""
        for pool in self.flow.pools:
            for worker in pool.workers:
                if worker.busy:
                    self.flow.on_pass_end(pool, worker, worker.visible_by(limit), limit)
