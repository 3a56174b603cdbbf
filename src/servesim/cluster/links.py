"""Bandwidth-priced KV transfer links between prefill and decode ranks.

In disaggregated serving a request's KV cache moves from the prefill rank that
computed it to the decode rank that continues it. A transfer *job* carries
*work*: its standalone delay in ms at the source's bandwidth (the caller prices
it). Each prefill rank owns one sending link of capacity 1 (work unit per ms);
each decode rank owns one receiving link of capacity ``receive_capacity``
(decode bandwidth / prefill bandwidth, ``math.inf`` when the decode side is
unbounded). A job uses exactly its two links; the two rank namespaces are
separate, so prefill rank 0 and decode rank 0 are different links::

    prefill 0 ──send (1)──┐               ┌──receive (r)── decode 0
                          ├── transfers ──┤
    prefill 1 ──send (1)──┘               └──receive (r)── decode 1

Two models (:class:`LinkModel`):

* ``shared``: rates are max-min fair, recomputed by progressive filling
  whenever the active set changes (submit, completion, cancel). Max-min is the
  allocation fair flow control converges to, and unlike an equal split per link
  it is work-conserving: a job held back by a busy link elsewhere leaves the
  rest of its share to the others instead of idling it. A lone job finishes at
  ``now + work / min(1, r)``.
* ``independent``: every job runs at the sending rate 1, whatever the others
  do and whatever the receiver's bandwidth, as the reference Dynamo 1.6.1
  prices a transfer (at the source's bandwidth alone).

Between changes service is linear (``remaining -= rate * dt``), so the next
completion is known exactly: the minimum over jobs of ``remaining / rate``.
:meth:`TransferLinks.advance` steps event by event; a job an event targets
completes exactly (``remaining := 0``), and so does any job left with a
rounding residue (at most ``1e-12`` of its work) by the same step, so
simultaneous completions stay simultaneous.

Invariants (checked by ``_check_invariants``):
  every active job has ``rate > 0`` and ``remaining <= work``;
  shared: no link's summed rate exceeds its capacity, and every job has a
  bottleneck, a full link on which no job runs faster (the definition of
  max-min fairness);
  independent: every job runs at 1 (links are not capacity-bound);
  the link clock never goes backwards; each job ends exactly once, reported
  complete by ``advance`` or removed by ``cancel``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum, StrEnum


class LinkModel(StrEnum):
    """How concurrent transfers share bandwidth."""

    SHARED = "shared"
    """Max-min fair sharing of sending and receiving links (the default)."""
    INDEPENDENT = "independent"
    """Every job at the full single-transfer rate (reference Dynamo 1.6.1)."""


class _End(IntEnum):
    """Which side of a transfer a link serves; part of the link key."""

    SEND = 0
    RECEIVE = 1


_Link = tuple[_End, int]

_RESIDUE = 1e-12
"""Relative remaining work below which a job completes with the step that left it."""

_TOLERANCE = 1e-9
"""Relative slack of the invariant checks, for float rounding."""


@dataclass(slots=True)
class _Job:
    """One active transfer: its links, its work and how much is left."""

    source: int
    destination: int
    work: float
    remaining: float
    rate: float = 0.0

    def links(self) -> tuple[_Link, _Link]:
        """The sending link of its prefill rank and the receiving link of its decode rank."""
        return (_End.SEND, self.source), (_End.RECEIVE, self.destination)

    def finish(self, clock: float) -> float:
        """When it completes at its current rate; never before ``clock``."""
        return clock + max(self.remaining, 0.0) / self.rate

    def done(self) -> float:
        """Service received so far."""
        return self.work - max(self.remaining, 0.0)


class TransferLinks:
    """Active KV transfers over per-rank links, served in virtual time.

    The link clock moves only forward, through ``advance`` (``submit`` and
    ``cancel`` advance to their ``now`` first). Completions found by those
    inner advances are held and returned by the next ``advance`` call, so every
    completion is reported exactly once and in time order.
    """

    __slots__ = ("_clock", "_done", "_jobs", "_mode", "_receive_capacity", "_unreported")

    def __init__(self, mode: LinkModel, receive_capacity: float = 1.0) -> None:
        """Create idle links at time 0.

        Args:
            mode: shared (max-min fair) or independent links.
            receive_capacity: capacity of each receiving link in work units per
                ms (decode / prefill bandwidth); ``math.inf`` for unbounded.

        Raises:
            ValueError: ``receive_capacity`` is not positive (or is NaN).
        """
        if not receive_capacity > 0:
            raise ValueError(f"receive capacity must be positive, got {receive_capacity}")
        self._mode = LinkModel(mode)
        self._receive_capacity = receive_capacity
        self._clock = 0.0
        self._jobs: dict[int, _Job] = {}
        # Work done by ended jobs (all of it when completed, part when cancelled):
        # one float per job, kept so work_done answers after the end.
        self._done: dict[int, float] = {}
        self._unreported: list[int] = []

    @property
    def active(self) -> int:
        """Number of transfers in flight."""
        return len(self._jobs)

    def submit(self, job: int, source: int, destination: int, work_ms: float, now: float) -> None:
        """Start a transfer at ``now`` and reshare the links.

        Args:
            job: unique id (the handoff id); completions tie-break on it.
            source: prefill rank that sends.
            destination: decode rank that receives.
            work_ms: standalone delay at the source's bandwidth, > 0.
            now: current time, not before the link clock.

        Raises:
            ValueError: ``job`` was already submitted.
        """
        assert work_ms > 0 and math.isfinite(work_ms), f"transfer work must be > 0: {work_ms}"
        if job in self._jobs or job in self._done:
            raise ValueError(f"transfer job {job} was already submitted")
        self._unreported.extend(self._advance(now))
        self._jobs[job] = _Job(source, destination, work_ms, work_ms)
        self._reallocate()

    def cancel(self, job: int, now: float) -> bool:
        """Remove a transfer at ``now``; its share returns to the others.

        Args:
            job: the transfer to drop.
            now: current time, not before the link clock.

        Returns:
            True if the job was in flight and is now removed; False if unknown,
            cancelled before, or complete (also when it completes exactly at
            ``now``: the next ``advance`` reports it).
        """
        self._unreported.extend(self._advance(now))
        dropped = self._jobs.pop(job, None)
        if dropped is None:
            return False
        self._done[job] = dropped.done()
        self._reallocate()
        return True

    def next_completion_ms(self) -> float:
        """Time of the next completion at current rates; ``math.inf`` when idle."""
        return min((job.finish(self._clock) for job in self._jobs.values()), default=math.inf)

    def advance(self, now: float) -> list[int]:
        """Serve the transfers up to ``now``, event by event.

        Args:
            now: the new link time, not before the link clock.

        Returns:
            Jobs completed at or before ``now`` and not reported yet, ordered by
            completion time, then by job id.
        """
        completed = self._unreported + self._advance(now)
        self._unreported = []
        return completed

    def work_done(self, job: int) -> float:
        """Service a submitted job has received (its full work once complete).

        Raises:
            ValueError: ``job`` was never submitted.
        """
        active = self._jobs.get(job)
        if active is not None:
            return active.done()
        if job in self._done:
            return self._done[job]
        raise ValueError(f"unknown transfer job {job}")

    # ---- internal: service -------------------------------------------------

    def _advance(self, now: float) -> list[int]:
        """Step through the completions up to ``now``; return them in order."""
        assert math.isfinite(now), f"link time must be finite: {now}"
        assert now >= self._clock, f"time went backwards: {now} < {self._clock}"
        completed: list[int] = []
        while (event := self.next_completion_ms()) <= now:
            completed.extend(self._step_to(event))
        self._serve(now - self._clock)
        self._clock = now
        return completed

    def _step_to(self, event: float) -> list[int]:
        """Serve to the next completion ``event``; end the jobs due then, by id."""
        targeted = {i for i, job in self._jobs.items() if job.finish(self._clock) <= event}
        self._serve(event - self._clock)
        self._clock = event
        # Exact completion: a targeted job's residue (positive or negative) is
        # rounding, as is a near-simultaneous job's; neither deserves its own event.
        finished = sorted(
            i
            for i, job in self._jobs.items()
            if i in targeted or job.remaining <= _RESIDUE * job.work
        )
        for i in finished:
            self._done[i] = self._jobs.pop(i).work
        self._reallocate()
        return finished

    def _serve(self, dt: float) -> None:
        """Linear service at the current rates for ``dt`` ms."""
        if dt > 0:
            for job in self._jobs.values():
                job.remaining -= job.rate * dt

    # ---- internal: rates ---------------------------------------------------

    def _capacity(self, link: _Link) -> float:
        """Work units per ms a link carries."""
        return 1.0 if link[0] is _End.SEND else self._receive_capacity

    def _members(self) -> dict[_Link, list[int]]:
        """Active job ids on each used link, in id order."""
        members: dict[_Link, list[int]] = {}
        for i in sorted(self._jobs):
            for link in self._jobs[i].links():
                members.setdefault(link, []).append(i)
        return members

    def _reallocate(self) -> None:
        """Recompute every active job's rate after the active set changed."""
        if self._mode is LinkModel.INDEPENDENT:
            for job in self._jobs.values():
                job.rate = 1.0
        else:
            self._fill()

    def _fill(self) -> None:
        """Max-min fair rates by progressive filling.

        All unfrozen jobs share one rising level; the first links to fill
        (summed rate reaching capacity) freeze their unfrozen jobs at that
        level; repeat until every job is frozen. Each round freezes at least one
        finite link, and every job has one (its sending link), so this ends.
        Levels are computed from capacities directly, not by accumulating
        increments, so repeated rounds add no drift.
        """
        members = self._members()
        frozen_load = dict.fromkeys(members, 0.0)
        unfrozen = {link: len(ids) for link, ids in members.items()}
        pending = set(self._jobs)
        while pending:
            level, full = self._lowest_level(frozen_load, unfrozen)
            for link in full:
                for i in members[link]:
                    if i in pending:
                        pending.remove(i)
                        self._freeze(i, level, frozen_load, unfrozen)

    def _lowest_level(
        self, frozen_load: dict[_Link, float], unfrozen: dict[_Link, int]
    ) -> tuple[float, list[_Link]]:
        """The level at which the next links fill, and those links (sorted)."""
        levels = {
            link: (self._capacity(link) - frozen_load[link]) / count
            for link, count in unfrozen.items()
            if count > 0 and math.isfinite(self._capacity(link))
        }
        level = min(levels.values())
        assert level > 0, f"progressive filling reached level {level}"
        return level, sorted(link for link, value in levels.items() if value == level)

    def _freeze(
        self,
        i: int,
        level: float,
        frozen_load: dict[_Link, float],
        unfrozen: dict[_Link, int],
    ) -> None:
        """Fix job ``i`` at ``level`` and move its rate to its links' frozen load."""
        job = self._jobs[i]
        job.rate = level
        for link in job.links():
            frozen_load[link] += level
            unfrozen[link] -= 1

    # ---- internal: tests and diagnostics -------------------------------------

    def _rates(self) -> dict[int, float]:
        """Current rate of each active job, in id order."""
        return {i: self._jobs[i].rate for i in sorted(self._jobs)}

    def _check_invariants(self) -> None:
        """Assert the module invariants (tests call this after every operation)."""
        for i, job in self._jobs.items():
            assert job.rate > 0, f"job {i} stalled"
            assert job.remaining <= job.work, f"job {i} gained work"
        if self._mode is LinkModel.INDEPENDENT:
            # Independent links are not capacity-bound: that is the model.
            assert all(job.rate == 1.0 for job in self._jobs.values()), "independent job shared"
            return
        members = self._members()
        loads = {link: sum(self._jobs[i].rate for i in ids) for link, ids in members.items()}
        for link, load in loads.items():
            assert load <= self._capacity(link) * (1 + _TOLERANCE), f"{link} overloaded: {load}"
        for i, job in self._jobs.items():
            assert any(
                self._is_bottleneck(job, link, members[link], loads[link]) for link in job.links()
            ), f"job {i} could run faster: rate {job.rate}"

    def _is_bottleneck(self, job: _Job, link: _Link, ids: list[int], load: float) -> bool:
        """Whether ``link`` is full and no job on it runs faster than ``job``."""
        full = load >= self._capacity(link) * (1 - _TOLERANCE)
        fastest = max(self._jobs[i].rate for i in ids)
        return full and job.rate >= fastest * (1 - _TOLERANCE)
