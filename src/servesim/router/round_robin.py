"""Round-robin placement over workers and their DP ranks.

Rotates across workers (``next % workers``) and, per worker, across its ranks,
so placements walk the ranks rank-major: worker 0 rank 0, worker 1 rank 0, ...,
worker 0 rank 1, worker 1 rank 1, ... Always immediate; never queues.
"""

from __future__ import annotations


class RoundRobinRouter:
    """Stateful rotation; ``place`` returns (worker id, dp rank)."""

    __slots__ = ("_dp_sizes", "_next_rank", "_next_worker")

    def __init__(self, dp_sizes: list[int]) -> None:
        self._dp_sizes = dp_sizes
        self._next_worker = 0
        self._next_rank = [0] * len(dp_sizes)

    def place(self) -> tuple[int, int]:
        """The next (worker, rank)."""
        worker = self._next_worker % len(self._dp_sizes)
        self._next_worker = worker + 1
        rank = self._next_rank[worker]
        self._next_rank[worker] = (rank + 1) % self._dp_sizes[worker]
        return worker, rank
