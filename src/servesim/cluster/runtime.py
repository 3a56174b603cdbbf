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
from servesim.engine.worker import PassOutputs, Worker
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
        # (end, worker id); an entry whose worker is no longer busy until that end is stale.
        self._completions: list[tuple[float, int]] = []
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
                self._apply_windows_up_to(max_sim_time_ms)
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
        completions, workers = self._completions, self.workers
        changed = False
        while completions and completions[0][0] == now:
            _, worker_id = heapq.heappop(completions)
            worker = workers[worker_id]
            if worker.busy_until != now:
                continue  # stale: its fast-forward window was cut to end earlier
            self._wakeable.add(worker_id)
            self._deliver(worker.finish_pass(), now)
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
            worker_id, rank = self.router.place()
            collector.on_route(record, worker_id, rank)
            request = EngineRequest(
                record.uid, spec.prompt, spec.output_length, shared_blocks=spec.shared_blocks
            )
            records[record.uid] = record
            self._released[record.uid] = item
            cut_end = self.workers[worker_id].submit(rank, request, now)
            if cut_end is not None:
                heapq.heappush(self._completions, (cut_end, worker_id))
            self._wakeable.add(worker_id)
        return bool(released)

    def _start_passes(self, now: float) -> bool:
        if not self._wakeable:
            return False
        started = False
        wakeable = sorted(self._wakeable)  # lowest worker id first
        self._wakeable.clear()
        records, on_admit = self._records, self.collector.on_admit
        for worker_id in wakeable:
            worker = self.workers[worker_id]
            if not worker.can_start():
                continue
            begun = worker.start_pass(now)
            if begun is None:
                continue
            started = True
            end, admitted = begun
            for request, reused in admitted:
                on_admit(records[request.uid], now, reused)
            if end > now:
                heapq.heappush(self._completions, (end, worker_id))
            else:
                self._wakeable.add(worker_id)
                self._deliver(worker.finish_pass(), now)
        return started

    def _apply_windows_up_to(self, limit: float) -> None:
        """At a time cap, make visible the fast-forwarded passes that end by ``limit``."""
        for worker in self.workers:
            if worker.in_window and worker.cut_by(limit):
                assert worker.busy_until is not None
                end = worker.busy_until
                self._deliver(worker.finish_pass(), end)

    # ----- pass effects -----

    def _deliver(self, outputs: PassOutputs, now: float) -> None:
        records, collector = self._records, self.collector
        on_token = collector.on_token
        for request in outputs.emitted:
            on_token(records[request.uid], now)
        for requests, times in outputs.streams:
            collector.on_token_stream([records[r.uid] for r in requests], times)
        for request in outputs.finished:
            self._end(request.uid, now, Terminal.COMPLETED)
        for request in outputs.rejected:
            self._end(request.uid, now, Terminal.REJECTED)

    def _end(self, uid: int, now: float, terminal: Terminal) -> None:
        record = self._records.pop(uid)
        self.collector.on_terminal(record, now, terminal)
        self.admission.on_finished(self._released.pop(uid), now)
        self._terminals += 1
        if self._progress is not None:
            self._progress(self._terminals)
