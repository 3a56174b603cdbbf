"""When each request of the workload reaches the cluster.

Open loop: a session's first turn arrives at its (normalised, sped-up) start
time. Closed loop (``concurrency``): at most N sessions are active; a session
is activated at the current time when a slot frees and keeps its slot through
all its turns and think times. In both, turn k+1 becomes ready at the
completion (or rejection) of turn k plus its delay.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from servesim.errors import ConfigError
from servesim.workload.request import RequestSpec, Session


@dataclass(slots=True)
class Released:
    """A request handed to the cluster at ``arrival_ms`` (``session``: its session's index,
    or its node's in an agentic graph)."""

    spec: RequestSpec
    session: int
    arrival_ms: float


class Admission(Protocol):
    """How a workload's requests reach the cluster: the loop asks when, takes them, reports ends."""

    ready_ms: float
    """Earliest time something can be released (-inf: now, a closed-loop slot is free).

    An attribute kept current by the admission's own changes, not a method: the loop
    reads it several times an instant."""

    def release(self, now: float) -> list[Released]:
        """Requests ready at or before ``now``, in release order."""
        ...

    def on_finished(self, released: Released, now: float) -> None:
        """A released request completed or was rejected at ``now``."""
        ...

    def drained(self) -> bool:
        """Nothing is left to release or waiting to end."""
        ...


def check_pacing(concurrency: int | None, speedup: float) -> None:
    """Refuse a closed loop of no requests or an arrival speed-up that is not a finite
    positive number (every admission checks both).

    Raises:
        ConfigError: naming the setting.
    """
    if concurrency is not None and concurrency < 1:
        raise ConfigError(f"replay concurrency must be at least 1, got {concurrency}")
    if not (math.isfinite(speedup) and speedup > 0):
        raise ConfigError(f"arrival speedup ratio must be a finite positive number, got {speedup}")


class AdmissionQueue:
    """Releases requests as they become ready and tracks sessions in flight."""

    def __init__(
        self, sessions: list[Session], *, concurrency: int | None = None, speedup: float = 1.0
    ) -> None:
        check_pacing(concurrency, speedup)
        self._sessions = sessions
        self._concurrency = concurrency
        self._delay_speedup = 1.0 if concurrency is not None else speedup
        # (ready, session, turn): turns ready at the same instant go out in session order,
        # as the reference's ready-session heap orders them (not in completion order).
        # An open loop's first turns are known up front: they wait in a sorted list, read
        # from _next_start on (a heap of all of them costs a sift per release); the heap
        # holds the turns readied since.
        self._heap: list[tuple[float, int, int]] = []
        self._starts: list[tuple[float, int, int]] = []
        self._next_start = 0
        self._inactive: deque[int] = deque()
        self._active = 0
        self._remaining_sessions = len(sessions)
        if concurrency is None:
            starts = [s.start_ms for s in sessions]
            assert all(t is not None for t in starts), "open-loop sessions need start times"
            origin = min(t for t in starts if t is not None)
            self._starts = sorted(
                ((start - origin) / speedup, i, 0)
                for i, start in enumerate(starts)
                if start is not None
            )
        else:
            self._inactive.extend(range(len(sessions)))
        self._starts.append((math.inf, len(sessions), 0))  # a sentinel: never released
        self.ready_ms = self._next_ready()

    def _next_ready(self) -> float:
        """What ``ready_ms`` is now: -inf while a closed-loop slot is free for a waiting session."""
        if self._inactive and self._concurrency is not None and self._active < self._concurrency:
            return -math.inf
        start = self._starts[self._next_start][0]
        heap = self._heap
        return heap[0][0] if heap and heap[0][0] < start else start

    def release(self, now: float) -> list[Released]:
        """Requests ready at or before ``now``, in release order."""
        if self._concurrency is not None:
            while self._inactive and self._active < self._concurrency:
                self._active += 1
                self._push(now, self._inactive.popleft(), 0)
        out = []
        heap, starts, sessions = self._heap, self._starts, self._sessions
        while True:
            start = starts[self._next_start]
            if heap and heap[0] < start:
                if heap[0][0] > now:
                    break
                _, session, turn = heapq.heappop(heap)
            elif start[0] <= now:
                _, session, turn = start
                self._next_start += 1
            else:
                break
            out.append(Released(sessions[session].turns[turn], session, now))
        self.ready_ms = self._next_ready()
        return out

    def on_finished(self, released: Released, now: float) -> None:
        """A request completed or was rejected: ready its session's next turn, or end the session."""
        turns = self._sessions[released.session].turns
        k = released.spec.turn_index or 0
        if k + 1 < len(turns):
            self._push(now + turns[k + 1].delay_ms / self._delay_speedup, released.session, k + 1)
            self.ready_ms = self._next_ready()
            return
        self._remaining_sessions -= 1
        if self._concurrency is not None:
            self._active -= 1
            self.ready_ms = self._next_ready()

    def drained(self) -> bool:
        """Every session has finished its last turn."""
        return self._remaining_sessions == 0

    def _push(self, ready: float, session: int, turn: int) -> None:
        heapq.heappush(self._heap, (ready, session, turn))
