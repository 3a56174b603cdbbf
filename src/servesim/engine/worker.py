"""One worker: ``dp_size`` rank schedulers that pass together.

A group pass starts when any rank has work; every rank with work runs its
pass at the same ``now`` and the group ends at the slowest rank's end. No rank
starts another pass before the group ends, and outputs become visible at the
group end. A pass mutates its ranks' state at its start (as the reference's
passes do); only its outputs wait for its end.

**Decode fast-forward.** When every working rank's next passes are decode
steps over a fixed running set (see :meth:`VllmScheduler.plan_decode`), the
worker plans a *window* of those passes at once: their durations (the group's
slowest rank, pass by pass) and ends come from one vectorised computation.
The window is applied when it ends, or earlier when something needs the
worker's state (a request or a handoff command arriving, see :meth:`cut`):
then it is applied up to the pass in flight and ends with that pass, at the
first pass end at or after that moment, where pass-by-pass stepping would
next start a pass. The state anyone sees is exactly what stepping gives.
Where nothing outside the worker reacts to a request's end before it is
delivered (``deferred_ends``: round robin, an open loop of one-turn sessions,
no telemetry, planner or time cap), a window may also run past members' last
tokens; their ends carry the time of their own pass
(:attr:`PassOutputs.ended_at`). Where nothing outside sees a pass end but
through the tokens it delivers (``chain``: round robin, no telemetry, planner or
time cap, a plain vLLM engine), and nothing can reach the worker before a
stepped pass ends, the window that would start at that end is planned with the
pass, in one busy period: the pass's outputs are delivered first, as of its end
(:attr:`PassOutputs.prelude`), and a request that reaches the worker by then
after all drops the window (:meth:`cut`).

**Published gauges.** With ``gauges`` on (telemetry), the worker keeps what
the reference's telemetry reads: each rank's counts as they stood after the
latest pass end or request submitted (a pass start publishes nothing, so a
sample in the middle of a pass shows the state before it), and the decode
request-forwards and their tokens of the passes ended so far. A telemetry
sample time splits a window (:meth:`split_at`), so that every pass end before
it is published when it happens.

**Forward-pass metrics.** With ``fpm`` on (a planner), each pass's metrics
per rank (:class:`~servesim.engine.scheduler.ForwardPass`) are published at
its end: a stepped pass's as its ranks measured them at its start, each
with the group's pass time (an idle rank's: zeros and that time), a window's those of its last pass
(whatever ended it: its plan, a cut, a split at a planner tick). A cut
publishes the pass that ended before it too, as stepping would have at its
end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from servesim.config import Backend, EngineConfig
from servesim.engine.kv.block_pool import KvEvent
from servesim.engine.request import EngineRequest
from servesim.engine.roles import DestinationRole, SourceRole
from servesim.engine.scheduler import (
    CatchUp,
    DecodePlan,
    ForwardPass,
    PassResult,
    RankGauges,
    RankScheduler,
)
from servesim.engine.timing import make_timing
from servesim.engine.vllm import VllmScheduler

if TYPE_CHECKING:
    from servesim.engine.kv.disk_tier import DiskTier
    from servesim.engine.kv.host_tier import HostTier
    from servesim.engine.sglang import SglangScheduler


def _scheduler(backend: Backend) -> type[VllmScheduler] | type[SglangScheduler]:
    """The rank scheduler a backend's workers run (SGLang's module loads with its first)."""
    if backend is Backend.SGLANG:
        from servesim.engine.sglang import SglangScheduler

        return SglangScheduler
    return VllmScheduler  # (TensorRT-LLM: vLLM's core under the no-evict policy)


MAX_WINDOW = 4096
"""Most passes one window plans (bounds the arrays; a longer stretch takes several windows)."""

_Queues = tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
"""Each rank's running and waiting requests (uids), in order."""


# Its own __init__: one a pass, at half the cost of the generated one (default factories).
@dataclass(slots=True, init=False)
class PassOutputs:
    """What a worker's pass (or fast-forwarded window) made visible at its end.

    Attributes:
        emitted: requests that produced one token, stamped at the end.
        finished: requests that reached their output length.
        ended_at: of those, the ones that did before the end (in a window that ran
            past their last token), by uid: when.
        rejected: requests dropped because they can never fit.
        cohorts: per rank's decode cohort, (when its members' previous token
            was stamped, how many members, the times of the tokens each of
            them got: the pass end, or a fast-forwarded window's pass ends).
        catch_ups: requests that left a decode cohort, with the tokens they
            got as members and the last one's time (delivered before the rest).
        seconds: cohort members whose token this was their second on their
            rank, with its time (None: the pass end).
        bursts: whether ``emitted`` may list a request more than once (see
            :class:`~servesim.engine.scheduler.PassResult`).
        prelude: the outputs of the stepped pass a window followed in the same busy
            period (see ``chain`` in :class:`Worker`), and that pass's end: delivered
            first, as of then (None: no such pass).
    """

    emitted: list[EngineRequest]
    finished: list[EngineRequest]
    ended_at: dict[int, float]
    rejected: list[EngineRequest]
    cohorts: list[tuple[float, int, np.ndarray | None]]
    catch_ups: list[CatchUp]
    seconds: list[tuple[list[EngineRequest], float | None]]
    bursts: bool
    prelude: tuple[PassOutputs, float] | None

    def __init__(self) -> None:
        self.emitted = []
        self.finished = []
        self.ended_at = {}
        self.rejected = []
        self.cohorts = []
        self.catch_ups = []
        self.seconds = []
        self.bursts = False
        self.prelude = None


@dataclass(slots=True)
class _Window:
    plans: list[tuple[RankScheduler, DecodePlan]]
    ends: np.ndarray  # end of each planned pass
    start: float
    follows: bool = False  # it follows a stepped pass ending at ``start`` (see Worker.chain)


@dataclass(slots=True)  # not frozen: one per eviction in a window, and a frozen init costs 3.7x
class ScheduledRemoval:
    """A Removed event a fast-forward window publishes at the end of one of its passes."""

    at_ms: float
    rank: int
    window: int
    pass_index: int
    block_hash: int


class Worker:
    """A worker's ranks and its pass lifecycle (idle, or busy until ``busy_until``)."""

    __slots__ = (
        "_cache_in_flight",
        "_carry",
        "_effect_free",
        "_forwards_in_flight",
        "_fpm_in_flight",
        "_outputs",
        "_removals",
        "_serial",
        "_valid_passes",
        "_window",
        "busy_until",
        "cache_hit_tokens",
        "cache_total_tokens",
        "chain",
        "config",
        "decode_forwards",
        "decode_tokens",
        "fast_forward",
        "found_nothing",
        "fpm_count",
        "fpm_ms",
        "fpms",
        "has_disk",
        "published",
        "ranks",
        "stalled",
        "worker_id",
    )

    def __init__(
        self,
        worker_id: int,
        config: EngineConfig,
        *,
        kv_events: bool = False,
        fast_forward: bool = True,
        disk: DiskTier | None = None,
        shared_host: tuple[HostTier, int] | None = None,
        gauges: bool = False,
        fpm: bool = False,
        deferred_ends: bool = False,
        anonymous_prompts: bool = False,
        chain: bool = False,
    ) -> None:
        """``deferred_ends``: nothing outside the worker reacts to a request's end before
        it is delivered, so windows may run past last tokens (see the module docstring);
        not with gauges or forward-pass metrics, which count each pass's members.
        ``anonymous_prompts``: a decode worker's ranks keep received prompts unnamed
        until their KV runs short (see :mod:`servesim.engine.vllm`).
        ``chain``: nothing outside the worker reacts to a pass's end but through the
        tokens it delivers, so a window may follow a stepped pass in the same busy
        period (see :meth:`start_pass`); a plain vLLM engine only."""
        assert not chain or (
            fast_forward
            and not (gauges or fpm or kv_events)
            and config.backend is Backend.VLLM
            and config.native_host_offload is None
            and disk is None
            and shared_host is None
        ), "a window may follow only a pass whose end nothing else sees"
        self.worker_id = worker_id
        self.config = config
        self.fast_forward = fast_forward
        self.chain = chain
        timing = make_timing(config)
        # With kv_events, each rank records its KV events for a router to drain (see take_events).
        scheduler = _scheduler(config.backend)
        self.ranks: list[RankScheduler] = [
            scheduler(
                config,
                timing,
                events=[] if kv_events else None,
                lazy=fast_forward,
                rank_index=worker_id * config.dp_size + rank,
            )
            for rank in range(config.dp_size)
        ]
        if deferred_ends:
            assert not (gauges or fpm), "gauges and FPMs count each pass's members"
            for rank in self.ranks:
                if isinstance(rank, VllmScheduler):
                    rank.windows_span_finishes = True
        if anonymous_prompts:
            assert not (gauges or fpm), "gauges and FPMs read the cache"
            for rank in self.ranks:
                assert isinstance(rank, VllmScheduler), "only a vLLM rank keeps prompts unnamed"
                rank.anonymous_prompts = True
        self.has_disk = disk is not None  # a disk tier under the ranks' host tier
        if disk is not None:
            for rank in self.ranks:
                assert isinstance(rank, VllmScheduler), "a disk tier sits under a vLLM host tier"
                rank.attach_disk(disk, worker_id)
        if shared_host is not None:
            # The deployment's shared host tier; this worker's ranks are its clients
            # ``first``, ``first + 1``, ...
            tier, first = shared_host
            for index, rank in enumerate(self.ranks):
                assert isinstance(rank, VllmScheduler), "a host tier serves vLLM ranks"
                rank.attach_shared_host(tier, first + index)
        self.busy_until: float | None = None
        # Set when a pass could do nothing; cleared when a request is submitted.
        self.stalled = False
        # Set with stalled: whether no rank could make progress (not a pass that repeated an
        # earlier one at the instant, see _repeats_effect_free). A worker with a disk tier
        # that found nothing tries again when the reference would drive it again.
        self.found_nothing = False
        # The instant of the latest passes that took no time and emitted nothing, and the
        # ranks' queues each left (see _repeats_effect_free).
        self._effect_free: tuple[float, set[_Queues]] | None = None
        # Outputs of the pass in flight, or of a window already applied, delivered at its end.
        self._outputs = PassOutputs()
        self._window: _Window | None = None
        # The latest window's number, how many of its passes happened (or will,
        # uncut), and the Removed events it will publish (taken by the flow).
        self._serial = 0
        self._valid_passes = 0
        self._removals: list[ScheduledRemoval] = []
        # Published gauges (see the module docstring); None when telemetry is off.
        self.published: list[RankGauges] | None = (
            [rank.gauges() for rank in self.ranks] if gauges else None
        )
        # Decode request-forwards and the tokens they made visible, by passes ended;
        # those of the pass (or window) in flight, counted at its end.
        self.decode_forwards = 0
        self.decode_tokens = 0
        self._forwards_in_flight = (0, 0)
        # Prefix-cache hit and prompt tokens of the passes ended (see PassResult.cache_tokens).
        self.cache_hit_tokens = 0
        self.cache_total_tokens = 0
        self._cache_in_flight = (0, 0)
        # Passes left of a window split at a sample time: the next window plans no
        # more, so that windows end where they would without the split.
        self._carry: int | None = None
        # Forward-pass metrics (see the module docstring): the latest published, per rank,
        # when and how many times; those of the pass in flight. None: not measured.
        self.fpms: list[ForwardPass] | None = None
        self.fpm_ms = 0.0
        self.fpm_count = 0
        self._fpm_in_flight: list[ForwardPass] = []
        if fpm:
            for rank in self.ranks:
                _vllm(rank).measure_fpm = True
            self.fpms = [ForwardPass() for _ in self.ranks]

    @property
    def busy(self) -> bool:
        """A pass (or window) is in flight."""
        return self.busy_until is not None

    def submit(self, rank: int, request: EngineRequest, now: float) -> float | None:
        """Queue a request on one of this worker's ranks.

        Returns:
            The worker's new, earlier busy-until time when the request cut a
            fast-forward window short (see :meth:`cut`); otherwise None.
        """
        end = self.cut(now)
        self.ranks[rank].submit(request)
        self.stalled = False
        if self.published is not None:
            self.publish()
        return end

    def publish(self) -> None:
        """Publish the ranks' gauges as they stand (telemetry on)."""
        self.published = [rank.gauges() for rank in self.ranks]

    def split_at(self, at: float) -> float | None:
        """End the window in flight with its last pass that ends by ``at`` (a telemetry sample).

        Stepping would publish gauges at each of those pass ends, so a sample
        at ``at`` must see the state after the last of them, not the window's
        later passes; the rest of the window is planned again from that end.

        Returns:
            The new, earlier busy-until time, or None when nothing changed.
        """
        window = self._window
        if window is None:
            return None
        passes = int(window.ends.searchsorted(at, side="right"))
        if passes == 0 or passes == len(window.ends):
            return None
        self._carry = len(window.ends) - passes
        return self._apply(window, passes)

    def cut(self, now: float, *, started: bool = False) -> float | None:
        """Bring the ranks' state to ``now``, as pass-by-pass stepping would have it.

        A window in flight is applied up to the pass in flight at ``now`` and
        ends with that pass: the one ending at ``now`` if one does, unless
        ``started`` (stepping would already have started the next pass at this
        instant), then the one starting at ``now``.

        Returns:
            The new, earlier busy-until time, or None when nothing changed.
        """
        self._carry = None  # stepping would start a full window after this instant too
        window = self._window
        if window is None:
            return None
        if window.follows and (now < window.start or (now == window.start and not started)):
            # The stepped pass before it is in flight, or ends now: stepping would end
            # it first, and the request would join the pass after it. The window never
            # began.
            self._window = None
            prelude = self._outputs.prelude
            assert prelude is not None
            self._outputs = prelude[0]
            self.busy_until = window.start
            return window.start
        done = int(window.ends.searchsorted(now, side="right" if started else "left"))
        passes = done + 1 if done < len(window.ends) else len(window.ends)  # (done >= 0)
        return self._apply(window, passes, ended=passes - 1)

    def visible_by(self, limit: float) -> PassOutputs:
        """At a time cap: the fast-forwarded tokens stamped by ``limit`` (nothing else ends by then).

        The caller stops the run: the worker's pass in flight never ends.
        """
        window = self._window
        if window is not None:
            assert not window.follows, "a run with a time cap chains no window (see chain)"
            passes = int(window.ends.searchsorted(limit, side="right"))
            if any(plan.prompt is not None for _, plan in window.plans):
                passes += 1  # a prompt's chunk counts from its pass's start, as stepping's
            self._apply(window, min(len(window.ends), max(1, passes)))
        done = self._outputs
        out = PassOutputs()
        # Passes applied to the ranks' state whose ends come after the cap, and when the
        # last pass before them ended: a window's tail, or the one pass in flight.
        hidden, last = 1, self.ranks[0].last_emit_ms
        for prev_end, members, times in done.cohorts:
            if times is not None:  # a fast-forwarded window (every rank's has the same ends)
                shown = times[times <= limit]
                hidden = len(times) - len(shown)
                last = float(shown[-1]) if len(shown) else prev_end
                if len(shown):
                    out.cohorts.append((prev_end, members, shown))
        out.seconds = [(r, at) for r, at in done.seconds if at is not None and at <= limit]
        for request, tokens, last_ms in done.catch_ups:
            if last_ms > limit:  # finished in a window's last pass, after the cap
                tokens, last_ms = tokens - hidden, last
            if tokens > 0:
                out.catch_ups.append((request, tokens, last_ms))
        for rank in self.ranks:
            rank.flush_cohort(rank.passes - hidden, last)
            out.catch_ups += rank.take_catch_ups()
        return out

    def can_start(self) -> bool:
        """Idle, not stalled, and some rank has work."""
        if self.busy_until is not None or self.stalled:
            return False
        # A loop, not any() over a generator: this runs twice an instant.
        for rank in self.ranks:  # noqa: SIM110
            if rank.has_work():
                return True
        return False

    def start_pass(
        self, now: float, quiet_until: float | None = None
    ) -> tuple[float, list[tuple[EngineRequest, int]]] | None:
        """Start one group pass (or a fast-forward window) at ``now``.

        A pass that makes no progress but lowers an SGLang rank's ``new_token_ratio`` is
        run again at the same instant (see :func:`_retry_at_same_instant`).
        ``quiet_until`` (with ``chain``): nothing can reach the worker before then; a
        stepped pass that ends earlier, and ends no request, may be followed by the
        window after it in the same busy period (see :meth:`_chain`).

        Returns:
            The end and the admissions made at the start, or None when no rank
            could make progress (the worker is then stalled until a submit).
        """
        if self.fast_forward:
            end = self._start_window(now, MAX_WINDOW if self._carry is None else self._carry)
            self._carry = None
            if end is not None:
                self._take_catch_ups()
                return end, []
        # Once, unless the pass is run again (see the docstring; no window could start
        # then: a rank with a waiting head plans none).
        while True:
            results = []
            ran = []
            admitted: list[tuple[EngineRequest, int]] = []
            progressed = False
            end = now
            for rank in self.ranks:
                if rank.has_work():
                    result = rank.execute_pass(now)
                    if result.finished or result.preempted:
                        rank.role.capacity_changed()  # a slot or blocks freed: its reservations are due
                    results.append(result)
                    ran.append(rank)
                    admitted += result.admitted
                    progressed |= result.progressed
                    if result.end_ms > end:
                        end = result.end_ms
            if progressed or any(rank.role.reservation_due() for rank in ran):
                break
            if not _retry_at_same_instant(ran):
                self.stalled = self.found_nothing = True
                return None
        if end == now and self._repeats_effect_free(now, results):
            # (The ranks ran the pass, which left their queues as an earlier one did; it
            # is not recorded, and only their preemption counts keep a trace of it.)
            self.stalled = True
            self.found_nothing = False
            return None
        # An empty pass still ends: a decode rank whose untried reservation head
        # waits (it blocks admission) tries it at that end, at the same instant.
        self.busy_until = end
        _collect(results, self._outputs)
        if self.fpms is not None:  # every rank reports the group's pass time
            self._fpm_in_flight = self._pass_fpms(ran, (self.busy_until - now) / 1000.0)
        if self.published is not None:
            self._forwards_in_flight = _decode_forwards(results)
            self._cache_in_flight = (
                sum(r.cache_tokens[0] for r in results),
                sum(r.cache_tokens[1] for r in results),
            )
        self._take_catch_ups()
        if quiet_until is not None and now < end < quiet_until:
            out = self._outputs
            if not (out.finished or out.rejected):
                self._chain(end)
        return self.busy_until, admitted

    def _chain(self, end: float) -> None:
        """Plan the window that would start when the stepped pass in flight ends at ``end``.

        Stepping would end that pass, deliver its outputs and start the window at
        the same instant. Nothing reaches the worker before then, and nothing but
        those outputs sees the pass end (the pass ended no request, ``chain``): the
        window follows the pass at once, and its outputs come after the pass's
        (:attr:`PassOutputs.prelude`). A request that reaches the worker by ``end``
        after all drops the window (see :meth:`cut`). Not while a request waits:
        a window then rarely forms, and planning one at each such pass would cost
        as much as the instants it saves.
        """
        ranks = self.ranks
        for rank in ranks:
            if rank.waiting:
                return
        for rank in ranks:
            rank.last_emit_ms = end  # (as the pass end would set it)
        if self._start_window(end, MAX_WINDOW) is None:
            return
        assert self._window is not None
        self._window.follows = True
        prelude, self._outputs = self._outputs, PassOutputs()
        self._outputs.prelude = (prelude, end)

    def _pass_fpms(self, ran: list[RankScheduler], wall: float) -> list[ForwardPass]:
        """Each rank's forward-pass metrics of a stepped group pass of ``wall`` seconds (an
        idle rank's: zeros with the pass's time). (Not inline: a comprehension that reads
        a caller's locals makes them cells, allocated at every call of the caller.)"""
        return [
            replace(_vllm(rank).fpm, wall_time_s=wall)
            if rank in ran
            else ForwardPass(wall_time_s=wall)
            for rank in self.ranks
        ]

    def _repeats_effect_free(self, now: float, results: list[PassResult]) -> bool:
        """Whether a pass that took no time, emitted nothing and only admitted or preempted
        requests left the ranks' queues as an earlier such pass at this instant did: the
        passes go round in a cycle that stepping would repeat for ever (a decode rank whose
        request, re-admitted from its cached prefix, cannot fit its speculative burst).
        The reference stops the replay there ("effect-free zero-duration pass") or never
        returns; the worker stalls instead, and the replay ends at a dead end unless
        something reaches it."""
        if any(r.emitted or r.finished or r.rejected for r in results):
            self._effect_free = None
            return False
        if not any(r.admitted or r.preempted for r in results):
            return False  # (an empty pass: a reservation tried at its end)
        queues = tuple(
            (tuple(r.uid for r in rank.running), tuple(r.uid for r in rank.waiting))
            for rank in self.ranks
        )
        seen = self._effect_free
        if seen is None or seen[0] != now:
            seen = self._effect_free = (now, set())
        if queues in seen[1]:
            return True
        seen[1].add(queues)
        return False

    def finish_pass(self) -> PassOutputs:
        """End the pass (or window) in flight and return what it made visible; the worker is idle again."""
        if self._window is not None:
            self._apply(self._window, len(self._window.ends))
        assert self.busy_until is not None
        for rank in self.ranks:
            rank.last_emit_ms = self.busy_until
            rank.complete_boundary(self.busy_until)
        if self.fpms is not None:
            self.fpms = self._fpm_in_flight
            self.fpm_ms = self.busy_until
            self.fpm_count += 1
        self.busy_until = None
        out, self._outputs = self._outputs, PassOutputs()
        if self.published is not None:
            forwards, tokens = self._forwards_in_flight
            self.decode_forwards += forwards
            self.decode_tokens += tokens
            self._forwards_in_flight = (0, 0)
            self.cache_hit_tokens += self._cache_in_flight[0]
            self.cache_total_tokens += self._cache_in_flight[1]
            self._cache_in_flight = (0, 0)
            self.publish()
        return out

    def break_stall(self) -> bool:
        """The replay reached a dead end: let each rank that can admit differently in its
        next pass (see :meth:`RankScheduler.break_stall`); whether any can (the caller then
        wakes the worker)."""
        broken = [rank.break_stall() for rank in self.ranks]  # every rank's, not the first's
        return any(broken)

    def next_internal_deadline(self) -> float:
        """When a rank next has work of its own, such as a KV copy completing (``math.inf``: none)."""
        return min(rank.next_internal_deadline() for rank in self.ranks)

    def process_internal(self, now: float) -> None:
        """While idle, let the ranks complete their own work due by ``now``."""
        assert self.busy_until is None
        for rank in self.ranks:
            rank.process_internal(now)
        self.stalled = False

    # ----- its ranks' parts in P/D handoffs (the disaggregated flow's commands) -----

    def source(self, rank: int) -> SourceRole:
        """The source side of a prefill worker's rank."""
        role = self.ranks[rank].role
        assert isinstance(role, SourceRole), f"worker {self.worker_id} is not a prefill worker"
        return role

    def destination(self, rank: int) -> DestinationRole:
        """The destination side of a decode worker's rank."""
        role = self.ranks[rank].role
        assert isinstance(role, DestinationRole), f"worker {self.worker_id} is not a decode worker"
        return role

    def never_fits(self, rank: int, request: EngineRequest) -> bool:
        """Whether a fresh request can never be served on the rank, however long it waits."""
        return self.ranks[rank].never_fits(request)

    def take_events(self) -> list[tuple[int, list[KvEvent]]]:
        """Each rank's KV events since the last call, as (rank, events).

        A pass's events become visible at its end, as the reference shows them
        to its router: none while a pass is in flight.
        """
        if self.busy_until is not None:
            return []
        out = []
        for index, rank in enumerate(self.ranks):
            events = rank.kv_events
            if events:
                out.append((index, events.copy()))
                events.clear()
        return out

    def in_flight(self) -> int:
        """Requests waiting or running on any rank."""
        return sum(len(r.waiting) + len(r.running) for r in self.ranks)

    def drained(self) -> bool:
        """Idle with nothing left to do: no pass, request, handoff duty or own work (a draining
        worker may then be removed)."""
        return (
            self.busy_until is None
            and self.in_flight() == 0
            and not any(rank.has_work() or rank.role.holds_work() for rank in self.ranks)
            and self.next_internal_deadline() == math.inf
        )

    def take_scheduled_removals(self) -> list[ScheduledRemoval]:
        """The Removed events of the window just started, each due at the end of its pass.

        A router that reads KV state in the middle of a window applies those
        due by then (see :meth:`removal_happened`); the window's real events
        follow when it is applied.
        """
        out, self._removals = self._removals, []
        return out

    def removal_happened(self, removal: ScheduledRemoval) -> bool:
        """Whether a scheduled removal's pass still belongs to this worker's history (not cut away)."""
        return removal.window == self._serial and removal.pass_index < self._valid_passes

    def _take_catch_ups(self) -> None:
        for rank in self.ranks:
            if rank.catch_ups:
                self._outputs.catch_ups += rank.take_catch_ups()

    def _apply(self, window: _Window, passes: int, *, ended: int = 0) -> float | None:
        """Apply the window's first ``passes`` passes; it then ends with the last of them.

        ``ended`` of them already ended (a cut): their decode forwards count now,
        the others' at the window's end.
        """
        self._window = None
        self._valid_passes = passes
        out = self._outputs
        times = window.ends[:passes]
        end = float(times[-1])
        if self.fpms is not None:
            if ended:  # the last pass that ended before the cut published at its end
                self.fpms = self._window_fpms(window, ended - 1)
                self.fpm_ms = float(window.ends[ended - 1])
                self.fpm_count += 1
            self._fpm_in_flight = self._window_fpms(window, passes - 1)
        if self.published is not None:
            members = sum(plan.members for _, plan in window.plans)
            self.decode_forwards += members * ended
            self.decode_tokens += members * ended
            in_flight = members * (passes - ended)
            self._forwards_in_flight = (in_flight, in_flight)
        for rank, plan in window.plans:
            if plan.stretches:  # members left along the way: one cohort a stretch
                before, start = plan.prev_end_ms, 0
                for stop, members in plan.stretches:
                    stretch = times[start:stop]
                    if not len(stretch):
                        break
                    out.cohorts.append((before, members, stretch))
                    before, start = float(stretch[-1]), stop
            elif plan.members:  # (a prompt's chunks may run beside no member)
                out.cohorts.append((plan.prev_end_ms, plan.members, times))
            if plan.seconds:
                out.seconds.append((plan.seconds, float(times[0])))
            finished = rank.commit_decode(plan, times)
            if finished:
                rank.role.capacity_changed()
                out.finished += finished
                out.catch_ups += rank.take_catch_ups()
                for request in finished if plan.stretches else ():
                    at = float(times[request.finish_step - plan.first_step])
                    if at != end:
                        out.ended_at[request.uid] = at
        if end == self.busy_until:
            return None
        self.busy_until = end
        return end

    def _window_fpms(self, window: _Window, index: int) -> list[ForwardPass]:
        """Each rank's forward-pass metrics of the window's pass ``index`` (an idle rank's:
        zeros with the pass's time)."""
        ends = window.ends
        wall = (float(ends[index]) - (float(ends[index - 1]) if index else window.start)) / 1000.0
        measured = {
            id(rank): _vllm(rank).window_fpm(plan, index, wall) for rank, plan in window.plans
        }
        return [measured.get(id(rank), ForwardPass(wall_time_s=wall)) for rank in self.ranks]

    def _start_window(self, now: float, limit: int) -> float | None:
        # A rank whose reservation queue head is due tries it at the next pass end
        # and may reserve: that pass must be stepped alone. (A head already tried
        # waits for a request to finish, which ends a window anyway.)
        ranks = self.ranks
        for rank in ranks:
            if rank.role.reservation_due():
                return None
        plans = []
        for rank in ranks:
            if rank.has_work():
                plan = rank.plan_decode(limit)
                if plan is None:
                    return None
                plans.append((rank, plan))
        first = plans[0][1]
        durations = first.durations
        passes = len(durations)
        if first.prefill_durations is not None:
            # A prompt's chunks: on a lone rank, and with no metrics that count its passes.
            if len(plans) > 1 or self.fpms is not None or self.published is not None:
                return None
            # Each pass as the clock advances: + its prefill part, then + its decode part.
            parts = np.empty(2 * passes)
            parts[0::2] = first.prefill_durations
            parts[1::2] = durations
            parts[0] += now
            ends = _running_sum(parts)[1::2].copy()
        else:
            if len(plans) > 1:  # as many passes as every rank planned, each as slow as the slowest
                passes = min(len(plan.durations) for _, plan in plans)
                durations = durations[:passes]
                for _, plan in plans[1:]:
                    if plan.prefill_durations is not None:
                        return None
                    durations = np.maximum(durations, plan.durations[:passes])
            # Sequential sums, as the clock advances pass by pass (now + d0, then + d1, ...).
            ends = durations.copy()
            ends[0] += now
            ends = _running_sum(ends)
        self._window = _Window(plans, ends, now)
        self._serial += 1
        self._valid_passes = passes
        removals: list[ScheduledRemoval] = []  # (only with KV events: loops, not a comprehension)
        for rank, plan in plans:
            index = self.ranks.index(rank) if plan.removals else -1  # (once a plan)
            for j, h in plan.removals:
                if j < passes:
                    removals.append(ScheduledRemoval(float(ends[j]), index, self._serial, j, h))
        self._removals = removals
        self.busy_until = float(ends[-1])
        return self.busy_until


_running_sum = np.add.accumulate
"""Cumulative sums, in order: the ufunc itself, a quarter of ``cumsum(out=...)``'s cost on a
window's hundred-odd passes (np.cumsum adds a Python wrapper, ``out=`` argument checks)."""


def _retry_at_same_instant(ran: list[RankScheduler]) -> bool:
    """After a group pass that made no progress: whether to run it again at once.

    The reference (``same_timestamp_retry``) runs a zero-duration pass without effects
    again at the same instant while that changes an SGLang rank's ``new_token_ratio``:
    each such pass decays it by one step, so it falls to its floor unless one of them
    admits first. The passes that would admit nothing are skipped: the ranks that ran
    get the ratio the first pass that admits a waiting head (as far as the admission
    budget goes) finds, or their floor when none does, and the pass is run again
    (if one does).
    """
    from servesim.engine.sglang import SglangScheduler  # (already loaded if a rank is one)

    ranks = [rank for rank in ran if isinstance(rank, SglangScheduler)]
    if not any(rank.ratio_lowered for rank in ranks):
        return False
    found = [n for n in (rank.ratio_steps_to_admit() for rank in ranks) if n is not None]
    steps = min(found) if found else None
    for rank in ranks:
        rank.decay_ratio_steps(steps)
    return steps is not None


def _vllm(rank: RankScheduler) -> VllmScheduler:
    """A rank that measures forward-pass metrics (only vLLM ranks do)."""
    assert isinstance(rank, VllmScheduler)
    return rank


def _decode_forwards(results: list[PassResult]) -> tuple[int, int]:
    """A stepped pass's decode request-forwards and the tokens they accepted.

    A rank that counts them itself says so (``drafted``); otherwise a
    request's first token comes from its prefill and is no decode forward,
    and a decode cohort's members each decode one token.
    """
    forwards = accepted = 0
    for result in results:
        if result.drafted is not None:
            forwards += result.drafted[0]
            accepted += result.drafted[1]
            continue
        tokens: dict[EngineRequest, int] = {}
        for request in result.emitted:
            tokens[request] = tokens.get(request, 0) + 1
        members = sum(count for _, count in result.cohorts)
        forwards += members
        accepted += members
        for request, count in tokens.items():
            if request.generated > count:
                forwards += 1
                accepted += count
    return forwards, accepted


def _collect(results: list[PassResult], out: PassOutputs) -> None:
    """Add the ranks' results to a worker's outputs (empty: the pass is the first since
    the last pass end)."""
    for result in results:
        out.emitted += result.emitted
        out.bursts |= result.bursts
        out.finished += result.finished
        out.rejected += result.rejected
        for prev_end, members in result.cohorts:  # (a loop: a comprehension is a call)
            out.cohorts.append((prev_end, members, None))
        if result.seconds:
            out.seconds.append((result.seconds, None))
