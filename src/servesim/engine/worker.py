"""One worker: ``dp_size`` rank schedulers that pass together.

A group pass starts when any rank has work; every rank with work runs its
pass at the same ``now`` and the group ends at the slowest rank's end. No rank
starts another pass before the group ends, and outputs become visible at the
group end.

**Decode fast-forward.** When every working rank's next passes are decode
steps over a fixed running set (see :meth:`VllmScheduler.plan_decode`), the
worker plans a *window* of those passes at once: their durations (the group's
slowest rank, pass by pass) and ends come from one vectorised computation.
Nothing is applied until the window ends; a request submitted meanwhile cuts
the window at the first pass end at or after its arrival (where pass-by-pass
stepping would admit it), and the window is applied up to there. The
worker's state at any pass end is exactly what pass-by-pass stepping gives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from servesim.config import EngineConfig
from servesim.engine.kv.block_pool import KvEvent
from servesim.engine.request import EngineRequest
from servesim.engine.timing import make_timing
from servesim.engine.vllm import DecodePlan, PassResult, VllmScheduler

MAX_WINDOW = 4096
"""Most passes one window plans (bounds the arrays; a longer stretch takes several windows)."""


@dataclass(slots=True)
class PassOutputs:
    """What a worker's pass (or fast-forwarded window) made visible at its end.

    Attributes:
        emitted: requests that produced one token, stamped at the end.
        streams: fast-forwarded requests (one rank's running set) and the times
            of the tokens each of them got.
        finished: requests that reached their output length.
        rejected: requests dropped because they can never fit.
    """

    emitted: list[EngineRequest] = field(default_factory=list)
    streams: list[tuple[list[EngineRequest], np.ndarray]] = field(default_factory=list)
    finished: list[EngineRequest] = field(default_factory=list)
    rejected: list[EngineRequest] = field(default_factory=list)


@dataclass(slots=True)
class _Window:
    plans: list[tuple[VllmScheduler, DecodePlan]]
    ends: np.ndarray  # end of each planned pass
    passes: int  # passes that will be applied (cut by submissions)


class Worker:
    """A worker's ranks and its pass lifecycle (idle, or busy until ``busy_until``)."""

    __slots__ = (
        "_results",
        "_window",
        "busy_until",
        "config",
        "fast_forward",
        "ranks",
        "stalled",
        "worker_id",
    )

    def __init__(
        self,
        worker_id: int,
        config: EngineConfig,
        *,
        events: list[KvEvent] | None = None,
        fast_forward: bool = True,
    ) -> None:
        self.worker_id = worker_id
        self.config = config
        self.fast_forward = fast_forward
        timing = make_timing(config)
        self.ranks = [VllmScheduler(config, timing, events=events) for _ in range(config.dp_size)]
        self.busy_until: float | None = None
        # Set when a pass could do nothing; cleared when a request is submitted.
        self.stalled = False
        self._results: list[PassResult] = []
        self._window: _Window | None = None

    def submit(self, rank: int, request: EngineRequest, now: float) -> float | None:
        """Queue a request on one of this worker's ranks.

        Returns:
            The worker's new, earlier busy-until time when the request cut a
            fast-forward window short; otherwise None.
        """
        self.ranks[rank].submit(request)
        self.stalled = False
        window = self._window
        if window is None:
            return None
        # Pass-by-pass, the request waits for the pass in flight at ``now``: cut at the first end >= now.
        cut = max(1, int(np.searchsorted(window.ends, now, side="left")) + 1)
        if cut >= window.passes:
            return None
        window.passes = cut
        self.busy_until = float(window.ends[cut - 1])
        return self.busy_until

    def can_start(self) -> bool:
        """Idle, not stalled, and some rank has work."""
        return (
            self.busy_until is None and not self.stalled and any(r.has_work() for r in self.ranks)
        )

    def start_pass(self, now: float) -> tuple[float, list[tuple[EngineRequest, int]]] | None:
        """Start one group pass (or a fast-forward window) at ``now``.

        Returns:
            The end and the admissions made at the start, or None when no rank
            could make progress (the worker is then stalled until a submit).
        """
        if self.fast_forward:
            end = self._start_window(now)
            if end is not None:
                return end, []
        results = [rank.execute_pass(now) for rank in self.ranks if rank.has_work()]
        if not any(r.progressed for r in results):
            self.stalled = True
            return None
        end = max(r.end_ms for r in results)
        self.busy_until = end
        self._results = results
        return end, [admission for r in results for admission in r.admitted]

    def finish_pass(self) -> PassOutputs:
        """End the pass (or window) in flight and return what it made visible; the worker is idle again."""
        self.busy_until = None
        out = PassOutputs()
        window = self._window
        if window is not None:
            self._window = None
            times = window.ends[: window.passes]
            for rank, plan in window.plans:
                out.streams.append((plan.requests, times))
                out.finished += rank.commit_decode(plan, window.passes)
            return out
        for result in self._results:
            out.emitted += result.emitted
            out.finished += result.finished
            out.rejected += result.rejected
        self._results = []
        return out

    def cut_window(self, limit: float) -> float | None:
        """Keep only the passes of the window in flight that end by ``limit`` (for a time cap).

        Returns:
            The new end, or None if no pass of the window ends by ``limit``.
        """
        window = self._window
        assert window is not None
        keep = int(np.searchsorted(window.ends[: window.passes], limit, side="right"))
        if keep == 0:
            return None
        window.passes = keep
        self.busy_until = float(window.ends[keep - 1])
        return self.busy_until

    @property
    def in_window(self) -> bool:
        """Whether a fast-forward window is in flight."""
        return self._window is not None

    def in_flight(self) -> int:
        """Requests waiting or running on any rank."""
        return sum(len(r.waiting) + len(r.running) for r in self.ranks)

    def _start_window(self, now: float) -> float | None:
        working = [rank for rank in self.ranks if rank.has_work()]
        plans = []
        for rank in working:
            plan = rank.plan_decode(MAX_WINDOW)
            if plan is None:
                return None
            plans.append((rank, plan))
        passes = min(len(plan.durations) for _, plan in plans)
        durations = plans[0][1].durations[:passes]
        for _, plan in plans[1:]:
            durations = np.maximum(durations, plan.durations[:passes])
        # Sequential sums, as the clock advances pass by pass (now + d0, then + d1, ...).
        ends = np.cumsum(np.concatenate(([now], durations)))[1:]
        self._window = _Window(plans=plans, ends=ends, passes=passes)
        self.busy_until = float(ends[-1])
        return self.busy_until
