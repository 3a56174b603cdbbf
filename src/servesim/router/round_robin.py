"""Round-robin placement over workers and their DP ranks.

Aggregated workers rotate across workers (``next % workers``) and, per
worker, across its ranks, so placements walk the ranks *rank-major*: worker 0
rank 0, worker 1 rank 0, ..., worker 0 rank 1, worker 1 rank 1, ... A
disaggregated pool walks its (worker, rank) pairs *worker-major*: worker 0
rank 0, worker 0 rank 1, ..., worker 1 rank 0, ... (both as the reference
does). Always immediate; never queues.

With a planner the routable workers change (:meth:`RoundRobinRouter.set_workers`):
the rotation then walks the ready workers in id order, going on from where it
was; a worker keeps its rank position while it stays routable.
"""

from __future__ import annotations


class RoundRobinRouter:
    """Stateful rotation; ``place`` returns (worker id, dp rank)."""

    __slots__ = ("_dp_sizes", "_ids", "_next_rank", "_next_worker", "_worker_major")

    def __init__(self, dp_sizes: list[int], *, worker_major: bool = False) -> None:
        self._dp_sizes = dp_sizes
        self._worker_major = worker_major
        self._next_worker = 0
        self._next_rank = [0] * len(dp_sizes)
        # The routable worker ids, in rotation order (None: all of them, 0..n-1).
        self._ids: list[int] | None = None

    def set_workers(self, workers: list[tuple[int, int]]) -> None:
        """Route only to these (worker id, dp size) pairs, in id order from now on."""
        ids = sorted(worker for worker, _ in workers)
        size = max(ids, default=-1) + 1
        if size > len(self._dp_sizes):
            grow = size - len(self._dp_sizes)
            self._dp_sizes = self._dp_sizes + [1] * grow
            self._next_rank += [0] * grow
        for worker, dp_size in workers:
            self._dp_sizes[worker] = dp_size
        self._ids = ids

    def place(self) -> tuple[int, int]:
        """The next (worker, rank)."""
        ids = self._ids
        if ids is None:
            worker = slot = self._next_worker % len(self._dp_sizes)
        else:
            assert ids, "no routable worker"
            slot = self._next_worker % len(ids)
            worker = ids[slot]
        rank = self._next_rank[worker]
        self._next_rank[worker] = (rank + 1) % self._dp_sizes[worker]
        # Worker-major stays on a worker until its ranks wrap; rank-major moves on every time.
        if not self._worker_major or self._next_rank[worker] == 0:
            self._next_worker = slot + 1
        return worker, rank
