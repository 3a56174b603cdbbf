"""The aggregated flow: a request is routed to one worker, which prefills and decodes it."""

from __future__ import annotations

import math

from servesim.cluster.runtime import Ledger, Pool
from servesim.engine.request import EngineRequest
from servesim.engine.worker import PassOutputs, Worker
from servesim.metrics.collector import RequestRecord, Terminal
from servesim.router.round_robin import RoundRobinRouter
from servesim.workload.admission import Released


class AggregatedFlow:
    """Round-robin placement over one pool of aggregated workers."""

    def __init__(self, pool: Pool, router: RoundRobinRouter, ledger: Ledger) -> None:
        self.pools = [pool]
        self._pool = pool
        self._router = router
        self._ledger = ledger

    def admit(self, record: RequestRecord, released: Released, now: float) -> None:
        """See :class:`~servesim.cluster.runtime.Flow`."""
        spec = released.spec
        worker, rank = self._router.place()
        self._ledger.collector.on_route(record, worker, rank)
        request = EngineRequest(
            record.uid, spec.prompt, spec.output_length, shared_blocks=spec.shared_blocks
        )
        self._pool.submit(worker, rank, request, now)

    def on_pass_start(
        self, pool: Pool, worker: Worker, admitted: list[tuple[EngineRequest, int]], now: float
    ) -> None:
        """See :class:`~servesim.cluster.runtime.Flow`."""
        ledger = self._ledger
        for request, reused in admitted:
            ledger.collector.on_admit(ledger.record(request.uid), now, reused)

    def on_pass_end(self, pool: Pool, worker: Worker, outputs: PassOutputs, now: float) -> None:
        """See :class:`~servesim.cluster.runtime.Flow`."""
        ledger = self._ledger
        ledger.deliver_tokens(outputs, now)
        for request in outputs.finished:
            ledger.end(request.uid, now, Terminal.COMPLETED)
        for request in outputs.rejected:
            ledger.end(request.uid, now, Terminal.REJECTED)

    def settle(self, now: float) -> bool:
        """See :class:`~servesim.cluster.runtime.Flow`: nothing of its own."""
        return False

    def next_deadline(self) -> float:
        """See :class:`~servesim.cluster.runtime.Flow`: no timers of its own."""
        return math.inf
