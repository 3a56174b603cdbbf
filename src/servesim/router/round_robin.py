"""Round-robin placement over workers and their DP ranks.

Aggregated workers rotate across workers (``next % workers``) and, per
worker, across its ranks, so placements walk the ranks *rank-major*: worker 0
rank 0, worker 1 rank 0, ..., worker 0 rank 1, worker 1 rank 1, ... A
disaggregated pool walks its (worker, rank) pairs *worker-major*: worker 0
rank 0, worker 0 rank 1, ..., worker 1 rank 0, ... (both as the reference
does). Always immediate; never queues.
"""

from __future__ import annotations


class RoundRobinRouter:
    """Stateful rotation; ``place`` returns (worker id, dp rank)."""

    __slots__ = ("_dp_sizes", "_next_rank", "_next_worker", "_worker_major")

    def __init__(self, dp_sizes: list[int], *, worker_major: bool = False) -> None:
        self._dp_sizes = dp_sizes
        self._worker_major = worker_major
        self._next_worker = 0
        self._next_rank = [0] * len(dp_sizes)

    def place(self) -> tuple[int, int]:
        """The next (worker, rank)."""
        worker = self._next_worker % len(self._dp_sizes)
        rank = self._next_rank[worker]
        self._next_rank[worker] = (rank + 1) % self._dp_sizes[worker]
        # Worker-major stays on a worker until its ranks wrap; rank-major moves on every time.
        if not self._worker_major or self._next_rank[worker] == 0:
            self._next_worker = worker + 1
        return worker, rank
