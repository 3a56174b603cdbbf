"""Copies that share bandwidth fairly, as Dynamo 1.6.1's ``FairTransfers`` moves them.

Each job belongs to a client (a worker or a rank) and moves a number of bytes
in one direction (reads and writes have separate budgets). A job moves no
bytes until its first byte is *ready* (submission plus a latency); from then
on, among the jobs moving bytes in its direction, it moves at::

    min(its client's rate / that client's jobs, shared rate / all jobs)

so rates change only when a job becomes ready or completes. Completion times
are therefore not known at submission: :meth:`FairTransfers.advance` steps
from event to event. Jobs completing at the same instant are reported in
submission order. A rate of ``math.inf`` is unlimited (0 GB/s in the
reference's settings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class _Job:
    jid: int
    client: int
    direction: int
    client_rate: float  # bytes per ms
    ready: float
    remaining: float


def bytes_per_ms(gbps: float) -> float:
    """A bandwidth in GB/s as bytes per ms (0: unlimited)."""
    return math.inf if gbps == 0 else gbps * 1e6


class FairTransfers:
    """Jobs under way and the clock they were last advanced to."""

    def __init__(self, shared_rates: tuple[float, float]) -> None:
        self._shared = shared_rates  # bytes per ms, per direction
        self._jobs: list[_Job] = []  # in submission order
        self.now = 0.0

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def submit(
        self, jid: int, client: int, direction: int, client_rate: float, ready: float, nbytes: float
    ) -> None:
        """Start a job whose first byte moves at ``ready`` (the clock is at or before it)."""
        self._jobs.append(_Job(jid, client, direction, client_rate, ready, nbytes))

    def clients(self) -> set[int]:
        """Clients with a job under way."""
        return {job.client for job in self._jobs}

    def _rates(self) -> list[float]:
        """Each job's current rate in bytes/ms (0 while it waits for its first byte)."""
        now, jobs = self.now, self._jobs
        total = [0, 0]
        local: dict[tuple[int, int], int] = {}
        for job in jobs:
            if job.ready <= now:
                total[job.direction] += 1
                key = (job.client, job.direction)
                local[key] = local.get(key, 0) + 1
        rates = []
        for job in jobs:
            if job.ready > now:
                rates.append(0.0)
                continue
            rate = job.client_rate / local[job.client, job.direction]
            rates.append(min(rate, self._shared[job.direction] / total[job.direction]))
        return rates

    def _event_times(self, rates: list[float]) -> list[float]:
        now = self.now
        return [
            job.ready if job.ready > now else now + job.remaining / rate
            for job, rate in zip(self._jobs, rates, strict=True)
        ]

    def next_event(self) -> float:
        """When the next job starts moving bytes or completes (``math.inf`` if none)."""
        if not self._jobs:
            return math.inf
        return min(self._event_times(self._rates()))

    def advance(self, target: float) -> list[tuple[int, float]]:
        """Move the clock to ``target``; return the jobs completed by then as (id, time)."""
        target = max(target, self.now)
        done: list[tuple[int, float]] = []
        while True:
            rates = self._rates()
            times = self._event_times(rates)
            event = min(times, default=math.inf)
            step = min(event, target)
            elapsed = step - self.now
            for job, rate, at in zip(self._jobs, rates, times, strict=True):
                if job.ready <= self.now:
                    job.remaining = 0.0 if at <= step else max(0.0, job.remaining - elapsed * rate)
            self.now = step
            finished = [j for j in self._jobs if j.ready <= step and j.remaining == 0.0]
            if finished:
                self._jobs = [j for j in self._jobs if not (j.ready <= step and j.remaining == 0.0)]
                done += [(job.jid, step) for job in finished]
            if event > target:
                return done
            if step == target and not finished:
                rates = self._rates()
                if all(t > target for t in self._event_times(rates)):
                    return done
