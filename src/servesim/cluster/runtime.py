"""The replay runtime: one loop, one clock, aggregated workers.

Virtual time is in ms. At each timestamp the runtime settles everything that
becomes possible at that instant, in a fixed order, until nothing changes:

1. pass completions due now (by worker id): tokens, completions, rejections;
2. arrivals ready now (including next turns unlocked by step 1): route and submit;
3. idle workers with work start a pass (lowest worker id first).

then jumps to the next timestamp: the earliest pass end or arrival. A pass is
decided at its start; its outputs become visible at its end.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

from servesim.engine.request import EngineRequest
from servesim.engine.vllm import PassResult
from servesim.engine.worker import Worker
from servesim.errors import SimulationError
from servesim.metrics.collector import Collector, RequestRecord, Terminal
from servesim.router.round_robin import RoundRobinRouter
from servesim.workload.admission import AdmissionQueue, Released

ProgressHook = Callable[[int], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutcome:
    """How the loop ended."""

    final_ms: float
    time_limited: bool


class Runtime:
    """Drives workers, router and admission queue through virtual time."""

    def __init__(
        self,
        workers: list[Worker],
        router: RoundRobinRouter,
        admission: AdmissionQueue,
        collector: Collector,
        *,
        progress: ProgressHook | None = None,
    ) -> None:
        self.workers = workers
        self.router = router
        self.admission = admission
        self.collector = collector
        self.now = 0.0
        self.worker_seconds = 0.0
        self._progress = progress
        self._completions: list[
            tuple[float, int]
        ] = []  # (end, worker id): one pass per worker at most
        self._pending: dict[int, list[tuple[int, PassResult]]] = {}
        # Workers whose state changed since they last tried to start a pass (a
        # submit or a pass end): only they can start one, so the settle loop
        # never scans idle workers.
        self._wakeable: set[int] = set()
        self._records: dict[int, RequestRecord] = {}
        self._released: dict[int, Released] = {}
        self._terminals = 0

    def run(self, max_sim_time_ms: float | None = None) -> RunOutcome:
        """Run until every request has ended (or the next timestamp passes the cap)."""
        self._settle()
        while True:
            upcoming = min(
                self.admission.next_ready_ms(self.now),
                self._completions[0][0] if self._completions else math.inf,
            )
            if upcoming == math.inf:
                break
            if max_sim_time_ms is not None and upcoming > max_sim_time_ms:
                return RunOutcome(final_ms=self.now, time_limited=True)
            # Cost integrates the provisioned workers over each clock advance, step by step.
            self.worker_seconds += (upcoming - self.now) / 1000.0 * len(self.workers)
            self.now = upcoming
            self._settle()
        stuck = sum(w.in_flight() for w in self.workers)
        if stuck or not self.admission.drained():
            raise SimulationError(
                f"simulation reached a dead end at {self.now:.3f} ms with {stuck} request(s) that can "
                "never be scheduled (a preempted sequence may have outgrown the KV cache)"
            )
        return RunOutcome(final_ms=self.now, time_limited=False)

    # ----- settle loop -----

    def _settle(self) -> None:
        now = self.now
        while True:
            changed = self._apply_completions(now)
            changed |= self._release_arrivals(now)
            changed |= self._start_passes(now)
            if not changed:
                return

    def _apply_completions(self, now: float) -> bool:
        completions = self._completions
        changed = False
        while completions and completions[0][0] == now:
            _, worker_id = heapq.heappop(completions)
            self.workers[worker_id].finish_pass()
            self._wakeable.add(worker_id)
            self._deliver(self._pending.pop(worker_id), now)
            changed = True
        return changed

    def _release_arrivals(self, now: float) -> bool:
        released = self.admission.release(now)
        collector, records = self.collector, self._records
        for item in released:
            spec = item.spec
            record = collector.on_arrival(
                spec.input_length,
                spec.output_length,
                item.arrival_ms,
                spec.session_id,
                spec.turn_index,
            )
            worker, rank = self.router.place()
            collector.on_route(record, worker, rank)
            request = EngineRequest(record.uid, spec.prompt, spec.output_length)
            records[record.uid] = record
            self._released[record.uid] = item
            self.workers[worker].submit(rank, request)
            self._wakeable.add(worker)
        return bool(released)

    def _start_passes(self, now: float) -> bool:
        if not self._wakeable:
            return False
        started = False
        wakeable = sorted(self._wakeable)  # lowest worker id first
        self._wakeable.clear()
        for worker_id in wakeable:
            worker = self.workers[worker_id]
            if not worker.can_start():
                continue
            end, results = worker.start_pass(now)
            if not results:
                continue
            started = True
            self._on_pass_start(results, now)
            if end > now:
                self._pending[worker_id] = results
                heapq.heappush(self._completions, (end, worker_id))
            else:
                worker.finish_pass()
                self._wakeable.add(worker_id)
                self._deliver(results, now)
        return started

    # ----- pass effects -----

    def _on_pass_start(self, results: list[tuple[int, PassResult]], now: float) -> None:
        records, on_admit = self._records, self.collector.on_admit
        for _, result in results:
            for request, reused in result.admitted:
                on_admit(records[request.uid], now, reused)

    def _deliver(self, results: list[tuple[int, PassResult]], now: float) -> None:
        records, on_token = self._records, self.collector.on_token
        for _, result in results:
            for request in result.emitted:
                on_token(records[request.uid], now)
            for request in result.finished:
                self._end(request.uid, now, Terminal.COMPLETED)
            for request in result.rejected:
                self._end(request.uid, now, Terminal.REJECTED)

    def _end(self, uid: int, now: float, terminal: Terminal) -> None:
        record = self._records.pop(uid)
        self.collector.on_terminal(record, now, terminal)
        self.admission.on_finished(self._released.pop(uid), now)
        self._terminals += 1
        if self._progress is not None:
            self._progress(self._terminals)
