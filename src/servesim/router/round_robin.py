"""Round-robin placement over workers and their DP ranks.

Aggregated workers (:class:`RoundRobinRouter`): rotates across workers
(``next % workers``) and, per worker, across its ranks, so placements walk the
ranks rank-major: worker 0 rank 0, worker 1 rank 0, ..., worker 0 rank 1,
worker 1 rank 1, ... Disaggregated pools (:class:`PoolRoundRobinRouter`): walks
the flattened (worker, rank) list, worker-major. Always immediate; never queues.
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


class PoolRoundRobinRouter:
    """Round robin over a disaggregated pool's (worker, rank) pairs, worker-major.

    The reference's pool round robin flattens the ranks in worker order and
    walks them: worker 0 rank 0, worker 0 rank 1, ..., worker 1 rank 0, ...
    (unlike the aggregated router above, which is rank-major).
    """

    __slots__ = ("_next", "_targets")

    def __init__(self, dp_sizes: list[int]) -> None:
        self._targets = [(worker, rank) for worker, dp in enumerate(dp_sizes) for rank in range(dp)]
        self._next = 0

    def place(self) -> tuple[int, int]:
        """The next (worker, rank)."""
        index = self._next % len(self._targets)
        self._next = index + 1
        return self._targets[index]
