"""The router's pending queue: requests wait here while every target is busy.

Order (first out first): higher ``strict_priority``, then higher policy score,
then earlier enqueue. Scores, with ``p = max(priority, 0)`` and the enqueue
time in seconds ``s``:

- ``fcfs``: p - s (earliest first)
- ``lcfs``: p + s (latest first)
- ``wspt``: (1 + p) / max(1, isl - best cached tokens) (shortest uncached prompt first)
"""

from __future__ import annotations

import heapq
from typing import Generic, TypeVar

T = TypeVar("T")


class RouterQueue(Generic[T]):
    """A priority queue of pending requests under one policy."""

    def __init__(self, policy: str) -> None:
        if policy not in ("fcfs", "lcfs", "wspt"):
            raise ValueError(f"unknown queue policy {policy!r}")
        self.policy = policy
        # (key, item): the key ends with the enqueue ordinal, so items are never compared.
        self._heap: list[tuple[tuple[int, float, int], T]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(
        self,
        item: T,
        *,
        now: float,
        isl: int,
        best_cached_tokens: int,
        priority: int = 0,
        strict_priority: int = 0,
    ) -> None:
        """Queue ``item`` arriving at ``now`` (ms)."""
        jump = max(priority, 0)
        if self.policy == "fcfs":
            score = jump - now / 1000.0
        elif self.policy == "lcfs":
            score = jump + now / 1000.0
        else:
            score = (1 + jump) / max(1, isl - best_cached_tokens)
        heapq.heappush(self._heap, ((-strict_priority, -score, self._seq), item))
        self._seq += 1

    def pop(self) -> T:
        """The next request to admit."""
        return heapq.heappop(self._heap)[1]
