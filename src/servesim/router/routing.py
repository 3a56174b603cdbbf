"""Placement policies the flows use: round robin, or the KV router with its queue.

A policy places a request on a (worker, DP rank) now, or keeps it pending;
every call may release pending requests (when loads fall), which the flow
dispatches at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from servesim.config import RouterConfig
from servesim.router.affinity import SessionAffinity
from servesim.router.kv_router import (
    KvRouter,
    Overlaps,
    Placement,
    RouteRequest,
    round_half_away,
)
from servesim.router.queue import RouterQueue
from servesim.router.round_robin import RoundRobinRouter


@dataclass(slots=True)  # one a request: not frozen (a frozen init costs 3.7x), built by position
class Routed:
    """A request placed on ``worker``'s rank ``rank`` at ``at_ms`` (after ``queued_ms`` in the router queue)."""

    uid: int
    worker: int
    rank: int
    at_ms: float
    queued_ms: float = 0.0
    overlap_blocks: int = 0
    best_overlap_blocks: int = 0


class PlacementPolicy(Protocol):
    """Where requests go."""

    watches_progress: bool
    """Whether :meth:`prefill_completed` and :meth:`request_ended` may change anything
    (False: they never do, and a flow need not call them)."""

    def place(self, request: RouteRequest, now: float, *, priority: int = 0) -> list[Routed]:
        """Route a new request; returns every request placed by this call."""
        ...

    def prefill_completed(self, uid: int, now: float) -> list[Routed]:
        """A request's prompt is computed; returns requests released from the queue."""
        ...

    def request_ended(self, uid: int, now: float) -> list[Routed]:
        """A request ended; returns requests released from the queue."""
        ...

    @property
    def pending(self) -> int:
        """Requests waiting in the policy's queue."""
        ...

    def set_routable(self, workers: list[tuple[int, int]], now: float) -> list[Routed]:
        """Route only to these (worker id, dp size) workers from now on (a planner changed
        the pool); returns requests released from the queue."""
        ...


class RoundRobinPolicy:
    """Round robin over workers and ranks (rank-major, or worker-major for a P/D pool); never queues."""

    watches_progress = False

    def __init__(self, dp_sizes: list[int], *, worker_major: bool = False) -> None:
        self.rotation = RoundRobinRouter(dp_sizes, worker_major=worker_major)
        """The rotation: a flow may place from it directly (it reads nothing of a request)."""

    def place(self, request: RouteRequest, now: float, *, priority: int = 0) -> list[Routed]:
        """See :class:`PlacementPolicy`."""
        worker, rank = self.rotation.place()
        return [Routed(request.uid, worker, rank, now)]

    def prefill_completed(self, uid: int, now: float) -> list[Routed]:
        """See :class:`PlacementPolicy`: nothing to release."""
        return []

    def request_ended(self, uid: int, now: float) -> list[Routed]:
        """See :class:`PlacementPolicy`: nothing to release."""
        return []

    @property
    def pending(self) -> int:
        """See :class:`PlacementPolicy`: it never queues."""
        return 0

    def set_routable(self, workers: list[tuple[int, int]], now: float) -> list[Routed]:
        """See :class:`PlacementPolicy`."""
        self.rotation.set_workers(workers)
        return []


@dataclass(slots=True)
class _Pending:
    request: RouteRequest
    enqueued_ms: float
    overlaps: Overlaps  # cached blocks per target when it entered the queue


class KvPolicy:
    """The KV router over ``workers x dp_size`` targets, with the optional busy queue.

    A target is busy while its uncached prompt tokens in flight exceed
    ``router_queue_threshold x max_num_batched_tokens``. With a threshold, a
    request waits while the queue is not empty or every target is busy; the
    queue drains whenever a prefill completes or a request ends. A queued
    request is priced with the overlaps it had when it entered the queue, as
    the reference does.
    """

    watches_progress = True  # the router's load accounting follows each request

    def __init__(
        self,
        router: KvRouter,
        dp_size: int,
        config: RouterConfig,
        max_batched_tokens: int | None,
        *,
        affinity: SessionAffinity | None = None,
    ) -> None:
        self.router = router
        self._affinity = affinity
        self._dp = dp_size
        self._queue: RouterQueue[_Pending] | None = None
        self._busy_tokens = math.inf
        if config.router_queue_threshold is not None:
            self._queue = RouterQueue(config.router_queue_policy)
            threshold = config.router_queue_threshold
            # Unbounded batches: only a zero threshold ever counts a target busy.
            self._busy_tokens = (
                threshold * max_batched_tokens
                if max_batched_tokens
                else (0.0 if threshold == 0 else math.inf)
            )

    def place(self, request: RouteRequest, now: float, *, priority: int = 0) -> list[Routed]:
        """See :class:`PlacementPolicy`."""
        queue = self._queue
        if queue is not None and (len(queue) or self._all_busy()):
            overlaps = self.router.overlaps(request)
            queue.push(
                _Pending(request, now, overlaps),
                now=now,
                isl=request.isl,
                best_cached_tokens=round_half_away(
                    self.router.best_effective(overlaps) * self.router.block_size
                ),
                priority=priority,
            )
            return []
        return [self._route(request, now, now, None)]

    def prefill_completed(self, uid: int, now: float) -> list[Routed]:
        """See :class:`PlacementPolicy`."""
        self.router.prefill_completed(uid)
        return self._drain(now)

    def request_ended(self, uid: int, now: float) -> list[Routed]:
        """See :class:`PlacementPolicy`."""
        self.router.free(uid)
        return self._drain(now)

    @property
    def pending(self) -> int:
        """Requests waiting in the queue."""
        return len(self._queue) if self._queue is not None else 0

    def set_routable(self, workers: list[tuple[int, int]], now: float) -> list[Routed]:
        """See :class:`PlacementPolicy`: targets of workers gone keep their load until
        their requests end; the queue drains onto the new set."""
        dp = self._dp
        total = max(self.router.targets, (max((w for w, _ in workers), default=-1) + 1) * dp)
        self.router.set_eligible([w * dp + r for w, _ in workers for r in range(dp)], total)
        return self._drain(now)

    def _drain(self, now: float) -> list[Routed]:
        queue = self._queue
        released: list[Routed] = []
        while queue is not None and len(queue) and not self._all_busy():
            pending = queue.pop()
            released.append(
                self._route(pending.request, now, pending.enqueued_ms, pending.overlaps)
            )
        return released

    def _route(
        self,
        request: RouteRequest,
        now: float,
        enqueued: float,
        overlaps: Overlaps | None,
    ) -> Routed:
        affinity = self._affinity
        preferred = affinity.preferred(request.session) if affinity is not None else None
        placement: Placement = self.router.select(request, preferred=preferred, overlaps=overlaps)
        self.router.add(request, placement)
        if affinity is not None:
            affinity.placed(request.session, placement.target)
        worker, rank = divmod(placement.target, self._dp)
        return Routed(
            uid=request.uid,
            worker=worker,
            rank=rank,
            at_ms=now,
            queued_ms=now - enqueued,
            overlap_blocks=placement.overlap_blocks,
            best_overlap_blocks=placement.best_overlap_blocks,
        )

    def _all_busy(self) -> bool:
        return self.router.all_loaded_beyond(self._busy_tokens)
