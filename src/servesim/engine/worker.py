"""One worker: ``dp_size`` rank schedulers that pass together.

A group pass starts when any rank has work; every rank with work runs its
pass at the same ``now`` and the group ends at the slowest rank's end. No rank
starts another pass before the group ends, and outputs become visible at the
group end.
"""

from __future__ import annotations

from servesim.config import EngineConfig
from servesim.engine.kv.block_pool import KvEvent
from servesim.engine.request import EngineRequest
from servesim.engine.timing import make_timing
from servesim.engine.vllm import PassResult, VllmScheduler


class Worker:
    """A worker's ranks and its pass lifecycle (idle or busy until ``busy_until``)."""

    __slots__ = ("busy_until", "config", "ranks", "stalled", "worker_id")

    def __init__(
        self, worker_id: int, config: EngineConfig, *, events: list[KvEvent] | None = None
    ) -> None:
        self.worker_id = worker_id
        self.config = config
        timing = make_timing(config)
        self.ranks = [VllmScheduler(config, timing, events=events) for _ in range(config.dp_size)]
        self.busy_until: float | None = None
        # Set when a pass could do nothing; cleared when a request is submitted.
        self.stalled = False

    def submit(self, rank: int, request: EngineRequest) -> None:
        """Queue a request on one of this worker's ranks."""
        self.ranks[rank].submit(request)
        self.stalled = False

    def can_start(self) -> bool:
        """Idle, not stalled, and some rank has work."""
        return (
            self.busy_until is None and not self.stalled and any(r.has_work() for r in self.ranks)
        )

    def start_pass(self, now: float) -> tuple[float, list[tuple[int, PassResult]]]:
        """Run one group pass from ``now``.

        Returns:
            The group end and each working rank's result. When no rank made
            progress the worker is marked stalled and stays idle.
        """
        results = [
            (i, rank.execute_pass(now)) for i, rank in enumerate(self.ranks) if rank.has_work()
        ]
        if not any(r.progressed for _, r in results):
            self.stalled = True
            return now, []
        end = max(r.end_ms for _, r in results)
        self.busy_until = end
        return end, results

    def finish_pass(self) -> None:
        """Mark the group pass as over; the worker is idle again."""
        self.busy_until = None

    def in_flight(self) -> int:
        """Requests waiting or running on any rank."""
        return sum(len(r.waiting) + len(r.running) for r in self.ranks)
