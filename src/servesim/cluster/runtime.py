"""The replay runtime: one loop, one clock, for aggregated and disaggregated flows.

Virtual time is in ms. At each timestamp the runtime settles everything that
becomes possible at that instant, in a fixed order, until nothing changes:

1. pass ends due now, by (stage, worker id) with stages aggregated < prefill
   < decode: their outputs go to the flow; then idle workers' own work due now
   (KV copies to and from a host tier completing);
2. the flow's own work due now (KV transfers, handoff actions);
3. arrivals ready now (including turns unlocked by step 1): the flow routes them;
4. idle workers with work start a pass, prefill pool before decode pool,
   lowest worker id first;

then jumps to the next timestamp: the earliest pass end, arrival, flow
deadline or idle worker's own deadline. A pass is decided at its start; its outputs become visible at its end.

Workers with a disk tier under their host tier are driven as the reference
drives its ready workers, since their waiters' lookups count disk probes each
time: one that found nothing to do tries again once for each time the
reference would drive it again at that instant (after any pass with effects,
and in each round after one that changed something), and once at every later
instant the runtime settles (see :meth:`Runtime._drive_disk_worker`). Runs
without a disk tier skip that bookkeeping.

With telemetry (:mod:`servesim.metrics.telemetry`), a sample due at a
timestamp is taken at the end of that instant's first round of the settle
loop, as the reference takes it (a disaggregated request released then has
not taken its first handoff step yet); one due between timestamps is taken
there without settling anything. Before either, fast-forward windows are
split at the sample time (:meth:`Worker.split_at`) so that the pass ends
before it happen, as stepping would have them. Cost is priced only at the
timestamps the run has without telemetry, so sampling changes no output.
A planner's tick (:mod:`servesim.cluster.planner`) splits windows the same
way, so that the forward-pass metrics it reads are those of the passes ended
by then. A scaling tick comes at the end of its instant's first round too,
after the sample due then: a disaggregated request released at that instant
takes its first handoff step in the next round, on the pools the tick left.

What happens to a request between arrival and its end is the *flow*'s
business (:mod:`servesim.cluster.flows`); the runtime owns the clock, the
pools' pass lifecycle and the ledger of requests in flight.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import TYPE_CHECKING, Protocol

from servesim.engine.request import EngineRequest
from servesim.engine.worker import PassOutputs, Worker
from servesim.errors import SimulationError
from servesim.metrics.collector import Collector, RequestRecord, Terminal
from servesim.workload.admission import Admission, Released

if TYPE_CHECKING:  # (telemetry loads when a replay samples, or plans)
    from servesim.metrics.telemetry import PoolView, Telemetry, TrafficWindow

ProgressHook = Callable[[int], None]


class Stage(IntEnum):
    """A pool's role; also the order of same-instant pass ends."""

    AGGREGATED = 0
    PREFILL = 1
    DECODE = 2


class WorkerState(Enum):
    """Where a worker is in its lifecycle (a planner moves it; a fixed fleet stays active).

    ::

        (up) -> STARTING --startup_time--> ACTIVE --(down)--> DRAINING --drained--> REMOVED
                    |                                                          ^
                    +------------------(down, before ready)--------------------+

    Starting, active and draining workers are paid for; only active ones are routable.
    """

    STARTING = "starting"
    ACTIVE = "active"
    DRAINING = "draining"
    REMOVED = "removed"


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    """One lifecycle change, as the report lists it."""

    at_ms: float
    stage: Stage
    worker_id: int
    prior: WorkerState | None
    state: WorkerState
    cause: str
    """What moved it, as the reference names it: ``planner_scale`` (a tick's target; an idle
    worker drained at a tick is removed then too), ``worker_ready_event`` (a startup
    finished) or ``drain_settlement`` (a draining worker finished its work)."""


# Enum members the loop reads per request, as globals (a read through the class costs ~15x).
_ACTIVE = WorkerState.ACTIVE
_COMPLETED = Terminal.COMPLETED

WorkerFactory = Callable[[int], Worker]
"""Builds the worker with a given id (a planner adds workers with new ids)."""


class Pool:
    """The workers of one stage, their lifecycle, and which of them may start a pass.

    Pass ends go on the runtime's heap as ``(end, stage, worker id)``; an entry
    whose worker is no longer busy until that end (its window was cut short)
    is stale and skipped. Worker ids are list indices and never reused: a
    removed worker stays in ``workers``, idle, in state REMOVED.
    """

    def __init__(
        self,
        stage: Stage,
        workers: list[Worker],
        completions: list[tuple[float, Stage, int]],
        *,
        factory: WorkerFactory | None = None,
    ) -> None:
        self.stage = stage
        self.workers = workers
        self.states = [WorkerState.ACTIVE] * len(workers)
        # When each worker entered its state (a planner's idle-FPM clock starts at readiness).
        self.since = [0.0] * len(workers)
        self._completions = completions
        self._factory = factory
        # Workers whose state changed since they last tried to start a pass (a
        # submit or a pass end): only they can start one, so the settle loop
        # never scans idle workers.
        self.wakeable: set[int] = set()
        # Starting, active and draining workers (what cost integrates).
        self.provisioned = len(workers)
        self.transitions: list[Transition] = []
        self._draining: set[int] = set()

    # ----- lifecycle -----

    def ids(self, state: WorkerState) -> list[int]:
        """The ids of the workers in ``state``, ascending."""
        return [i for i, st in enumerate(self.states) if st is state]

    def routable(self) -> list[tuple[int, int]]:
        """The active workers as (id, dp size), for the pool's router."""
        return [(i, self.workers[i].config.dp_size) for i in self.ids(WorkerState.ACTIVE)]

    def scale_to(self, target: int, now: float, startup_ms: float) -> list[int]:
        """Bring starting plus active workers to ``target``.

        Up: new workers with new ids, starting (ready ``startup_ms`` later) or,
        without a startup time, active at once. Down: starting workers are
        cancelled first, highest id first, then the highest-id active workers
        drain (no new placements; removed once drained, at
        once if idle).

        Returns:
            The ids of the workers that started (the caller arms their readiness).
        """
        starting = self.ids(WorkerState.STARTING)
        active = self.ids(WorkerState.ACTIVE)
        effective = len(starting) + len(active)
        started: list[int] = []
        if target > effective:
            assert self._factory is not None, "a pool that scales up has a worker factory"
            for _ in range(target - effective):
                worker_id = len(self.workers)
                self.workers.append(self._factory(worker_id))
                self.states.append(WorkerState.REMOVED)  # set just below
                self.since.append(now)
                state = WorkerState.STARTING if startup_ms > 0 else WorkerState.ACTIVE
                self._move(worker_id, state, now, "planner_scale", new=True)
                self.provisioned += 1
                if state is WorkerState.STARTING:
                    started.append(worker_id)
        excess = effective - target
        for worker_id in reversed(starting):
            if excess <= 0:
                break
            self._move(worker_id, WorkerState.REMOVED, now, "planner_scale")
            self.provisioned -= 1
            excess -= 1
        for worker_id in reversed(active):
            if excess <= 0:
                break
            self._move(worker_id, WorkerState.DRAINING, now, "planner_scale")
            excess -= 1
            if self.workers[worker_id].drained():
                self._move(worker_id, WorkerState.REMOVED, now, "planner_scale")
                self.provisioned -= 1
            else:
                self._draining.add(worker_id)
        return started

    def ready(self, worker_id: int, now: float) -> bool:
        """A startup finished: the worker becomes active (False: it was cancelled meanwhile)."""
        if self.states[worker_id] is not WorkerState.STARTING:
            return False
        self._move(worker_id, WorkerState.ACTIVE, now, "worker_ready_event")
        return True

    def remove_drained(self, now: float) -> bool:
        """Remove the draining workers that have nothing left to do; whether any was."""
        done = [i for i in sorted(self._draining) if self.workers[i].drained()]
        for worker_id in done:
            self._draining.discard(worker_id)
            self._move(worker_id, WorkerState.REMOVED, now, "drain_settlement")
            self.provisioned -= 1
        return bool(done)

    def _move(
        self, worker_id: int, state: WorkerState, now: float, cause: str, *, new: bool = False
    ) -> None:
        before = None if new else self.states[worker_id]
        self.states[worker_id] = state
        self.since[worker_id] = now
        self.transitions.append(
            Transition(
                at_ms=now,
                stage=self.stage,
                worker_id=worker_id,
                prior=before,
                state=state,
                cause=cause,
            )
        )

    def submit(self, worker_id: int, rank: int, request: EngineRequest, now: float) -> None:
        """Queue a request on a worker's rank (an active one: nothing is placed elsewhere)."""
        assert self.states[worker_id] is _ACTIVE, (
            f"{self.stage.name.lower()} worker {worker_id} is {self.states[worker_id].value}"
        )
        worker = self.workers[worker_id]
        self._rescheduled(worker_id, worker.submit(rank, request, now))
        if not worker.busy:  # a busy worker tries again at its pass end anyway
            self.wakeable.add(worker_id)

    def settle_worker(self, worker_id: int, now: float, *, started: bool = False) -> bool:
        """Bring a worker's state to ``now`` before a command touches it (``started``: see
        :meth:`Worker.cut`).

        Returns:
            Whether a pass is in flight (a command that must not disturb it
            waits for its end).
        """
        worker = self.workers[worker_id]
        self._rescheduled(worker_id, worker.cut(now, started=started))
        return worker.busy

    def commanded(self, worker_id: int) -> None:
        """A handoff command changed an idle worker's state: it publishes its gauges (telemetry on)."""
        worker = self.workers[worker_id]
        if worker.published is not None:
            worker.publish()

    def wake(self, worker_id: int) -> None:
        """Something changed a worker's state: let it try to start a pass at the next opportunity."""
        self.workers[worker_id].stalled = False
        self.wakeable.add(worker_id)

    def schedule_end(self, worker_id: int, end: float) -> None:
        """Put a worker's pass end on the heap."""
        heapq.heappush(self._completions, (end, self.stage, worker_id))

    def split_at(self, worker_id: int, at: float) -> float | None:
        """Split a worker's window at a sample time (see :meth:`Worker.split_at`); its new end."""
        end = self.workers[worker_id].split_at(at)
        self._rescheduled(worker_id, end)
        return end

    def view(self) -> PoolView:
        """The pool as a telemetry sample sees it."""
        from servesim.metrics.telemetry import PoolView

        workers = self.workers
        return PoolView(
            active=[workers[i] for i in self.ids(WorkerState.ACTIVE)],
            starting=self.ids(WorkerState.STARTING),
            draining=[workers[i] for i in self.ids(WorkerState.DRAINING)],
        )

    def _rescheduled(self, worker_id: int, end: float | None) -> None:
        if end is not None:
            self.schedule_end(worker_id, end)


class Ledger:
    """Requests in flight: their records, how the workload released them, and their end."""

    def __init__(
        self, collector: Collector, admission: Admission, progress: ProgressHook | None
    ) -> None:
        self.collector = collector
        self._admission = admission
        self._progress = progress
        # The traffic windows that watch the workload (telemetry's sample interval, the
        # planner's time since its last tick).
        self.windows: list[TrafficWindow] = []
        self._records: dict[int, RequestRecord] = {}
        self._released: dict[int, Released] = {}
        self._ended = 0

    def open(self, record: RequestRecord, released: Released) -> None:
        """A request entered the cluster."""
        self._records[record.uid] = record
        self._released[record.uid] = released

    def record(self, uid: int) -> RequestRecord:
        """The record of a request in flight."""
        return self._records[uid]

    def is_open(self, uid: int) -> bool:
        """Whether the request is in flight (entered and not ended)."""
        return uid in self._records

    def deliver_tokens(self, outputs: PassOutputs, now: float) -> None:
        """Client-visible tokens of a pass (or window) that ended at ``now``."""
        records, collector = self._records, self.collector
        for requests, at in outputs.seconds:
            for request in requests:
                collector.on_second_token(records[request.uid], now if at is None else at)
        for request, tokens, last_ms in outputs.catch_ups:
            collector.on_catch_up(records[request.uid], tokens, last_ms)
        for prev_end, count, times in outputs.cohorts:
            if times is None:
                collector.on_shared_gap(now - prev_end, count)
            else:
                collector.on_shared_gaps(prev_end, count, times)
        on_token = collector.on_token
        for request in outputs.emitted:
            on_token(records[request.uid], now)

    def end(self, uid: int, now: float, terminal: Terminal, *, seal: bool = True) -> None:
        """The request completed or was rejected at ``now``; its session may go on.

        ``seal`` False: the flow still records facts about it and seals it later
        (see :meth:`Collector.seal`).
        """
        record = self._records.pop(uid)
        self.collector.on_terminal(record, now, terminal, seal=seal)
        if terminal is _COMPLETED:
            for window in self.windows:
                window.on_completed(record)
        self._admission.on_finished(self._released.pop(uid), now)
        self._ended += 1
        if self._progress is not None:
            self._progress(self._ended)

    @property
    def in_flight(self) -> int:
        """Requests that entered and have not ended."""
        return len(self._records)


class Flow(Protocol):
    """What happens to a request between arrival and its end."""

    pools: list[Pool]
    timers: bool
    """Whether the flow has work of its own due at times it sets (False: :meth:`settle`
    and :meth:`next_deadline` never have anything, and the loop does not ask them)."""

    def admit(self, record: RequestRecord, released: Released, now: float) -> None:
        """A request arrived: route it and hand it to a worker (or start its handoff)."""
        ...

    def on_pass_start(
        self, pool: Pool, worker: Worker, admitted: list[tuple[EngineRequest, int]], now: float
    ) -> None:
        """A worker started a pass that admitted ``admitted`` (request, reused tokens)."""
        ...

    def on_pass_end(self, pool: Pool, worker: Worker, outputs: PassOutputs, now: float) -> None:
        """A worker's pass (or window) ended at ``now`` with ``outputs``."""
        ...

    def on_own_work(self, pool: Pool, worker: Worker, now: float) -> None:
        """An idle worker did work of its own at ``now`` (such as completing a KV copy)."""
        ...

    def settle(self, now: float, *, workers_driven: bool) -> bool:
        """Do the flow's own work due at ``now``; return whether anything changed.

        ``workers_driven``: this instant's idle workers have had their chance to
        start a pass (every settle round but the first).
        """
        ...

    def next_deadline(self) -> float:
        """When the flow next has work of its own (``math.inf`` if none)."""
        ...

    def router_pending(self) -> tuple[int, int]:
        """Requests pending in the (prefill, decode) routers' queues (aggregated: decode)."""
        ...

    def set_routable(self, pool: Pool, now: float) -> None:
        """A pool's active workers changed: its router routes to them from now on."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalingSnapshot:
    """What a scaling policy sees at a tick: the settled pools (read, never changed)."""

    ordinal: int
    now_ms: float
    pools: dict[Stage, Pool]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleDecision:
    """A tick's decision: target worker counts (starting plus active) by stage, next tick."""

    targets: dict[Stage, int]
    next_tick_ms: float


class ScalingPolicy(Protocol):
    """Decides pool sizes at ticks (the planner; a scripted schedule in tests)."""

    def initial_tick_ms(self) -> float:
        """When the first tick is due (``math.inf``: never)."""
        ...

    def on_tick(self, snapshot: ScalingSnapshot) -> ScaleDecision:
        """The decision at a tick, taken after the instant settled and telemetry sampled it."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutcome:
    """How the loop ended, and the worker-seconds each stage was provisioned for."""

    final_ms: float
    time_limited: bool
    worker_seconds: dict[Stage, float]


class Runtime:
    """Drives the flow, its pools and the admission queue through virtual time."""

    # Slots, not a dict: past 30 attributes an instance's dict no longer shares its
    # class's keys, and CPython 3.11 then specialises no call of a method on it.
    __slots__ = (
        "_completions",
        "_deadlines",
        "_disk",
        "_drives",
        "_flow_timers",
        "_last_drive",
        "_last_drive_at",
        "_last_natural",
        "_own_work",
        "_pools",
        "_priced_counts",
        "_priced_ms",
        "_readies",
        "_round_changed",
        "_scaled",
        "_shared_own_work",
        "_split_at_ticks",
        "_split_ends",
        "_stalls_broken_at",
        "_tick_at",
        "_ticks",
        "_timed",
        "_wakeables",
        "_wakes",
        "_worker_seconds",
        "admission",
        "flow",
        "ledger",
        "now",
        "scaling",
        "telemetry",
    )

    def __init__(
        self,
        flow: Flow,
        admission: Admission,
        ledger: Ledger,
        completions: list[tuple[float, Stage, int]],
        telemetry: Telemetry | None = None,
        scaling: ScalingPolicy | None = None,
        *,
        split_at_ticks: bool = False,
    ) -> None:
        self.flow = flow
        self.scaling = scaling
        # A policy that reads the passes ended by a tick (the planner's FPMs): windows are
        # split at the tick as at a telemetry sample.
        self._split_at_ticks = split_at_ticks
        self.admission = admission
        self.ledger = ledger
        self.telemetry = telemetry
        self.now = 0.0
        # Cost: the provisioned workers (per pool) since _priced_ms, not yet charged, and
        # the latest instant a run without telemetry has (telemetry-only ones do not count).
        self._priced_ms = 0.0
        self._priced_counts = tuple(pool.provisioned for pool in flow.pools)
        self._last_natural = 0.0
        # Pass ends that exist only because a window was split at a sample time.
        self._split_ends: set[tuple[float, Stage, int]] = set()
        # Scaling: the next tick, ticks so far, startups finishing (time, stage, worker
        # id), and whether any pool changed (then draining workers are watched).
        self._tick_at = math.inf
        self._ticks = 0
        self._readies: list[tuple[float, Stage, int]] = []
        self._scaled = False
        self._completions = completions
        self._pools = {pool.stage: pool for pool in flow.pools}
        self._wakeables = [pool.wakeable for pool in flow.pools]  # emptied and filled in place
        self._worker_seconds = dict.fromkeys(self._pools, 0.0)
        # Idle workers' own deadlines (engine-owned work: KV copies completing), as
        # (time, stage, worker id); _wakes holds the one pushed last for each worker.
        self._own_work = any(
            w.config.native_host_offload is not None for p in flow.pools for w in p.workers
        )
        # A shared host tier, or a disk tier (its completions are seen by every worker,
        # whose waiters then look again): any copy may change every idle worker's deadline.
        self._shared_own_work = any(
            w.config.native_host_offload is not None
            and (
                w.config.native_host_offload.scope == "cluster_shared"
                or w.config.g3_offload is not None
            )
            for p in flow.pools
            for w in p.workers
        )
        self._deadlines: list[tuple[float, Stage, int]] = []
        self._wakes: dict[tuple[int, int], float] = {}
        # Whether an instant may hold own-work deadlines, startups, drains, a telemetry
        # sample or a scaling tick (most runs have none of them: the settle loop skips
        # looking for them).
        self._timed = self._own_work or scaling is not None or telemetry is not None
        self._flow_timers = flow.timers
        # The instant at which stuck ranks were last let admit past their heads.
        self._stalls_broken_at = -math.inf
        # A disk tier (under aggregated workers only, all of them or none): the workers are
        # driven as the reference drives its ready workers (see _drive_disk_worker). The
        # reference's drives so far, whether the settle round changed anything, and, at the
        # instant _last_drive_at, up to which drive each worker still trying has run its
        # passes. Runs without a disk tier never read them.
        self._disk = any(w.has_disk for p in flow.pools for w in p.workers)
        self._drives = 0
        self._round_changed = False
        self._last_drive: dict[int, int] = {}
        self._last_drive_at = -math.inf

    def run(self, max_sim_time_ms: float | None = None) -> RunOutcome:
        """Run until every request has ended (or the next timestamp passes the cap)."""
        self._settle()
        telemetry = self.telemetry
        if telemetry is not None:
            telemetry.baseline(self.now, *self._observed())
        if self.scaling is not None:
            first = self.scaling.initial_tick_ms()
            self._tick_at = max(first, self.now) if math.isfinite(first) else math.inf
            self._run_ticks()
        cap = math.inf if max_sim_time_ms is None else max_sim_time_ms
        while True:
            upcoming = self._upcoming()
            if telemetry is not None and telemetry.next_ms <= min(upcoming, cap) < math.inf:
                self._sample_due(telemetry, upcoming)
                continue
            if upcoming == math.inf:
                if self._break_stalls():
                    continue
                break
            if upcoming > cap:
                self._deliver_windows_up_to(cap)
                return self._outcome(time_limited=True)
            if self._split_at_ticks and upcoming == self._tick_at and self._split_windows(upcoming):
                continue  # a window now ends by the tick: the loop settles its end first
            self._advance(upcoming)
            self._settle()
        if self.ledger.in_flight or not self.admission.drained():
            raise SimulationError(
                f"simulation reached a dead end at {self.now:.3f} ms with {self.ledger.in_flight} "
                "request(s) that can never finish (a preempted sequence may have outgrown the KV cache)"
            )
        return self._outcome(time_limited=False)

    def _upcoming(self) -> float:
        """The next timestamp: the earliest arrival, pass end or deadline (and, while the
        workload is not done, scaling tick or startup finishing)."""
        completions, pools = self._completions, self._pools
        # A window cut short leaves its first end on the heap: drop it here, so that the
        # loop never visits an instant at which nothing happens.
        while completions:
            at, stage, worker_id = completions[0]
            if pools[stage].workers[worker_id].busy_until == at:
                break
            heapq.heappop(completions)
        upcoming = self.admission.ready_ms
        if upcoming < self.now:
            upcoming = self.now  # (a closed-loop slot is free)
        if completions and completions[0][0] < upcoming:
            upcoming = completions[0][0]
        if self._flow_timers:
            upcoming = min(upcoming, self.flow.next_deadline())
        if self._timed:
            if self._deadlines:
                upcoming = min(upcoming, self._deadlines[0][0])
            if self.scaling is not None and not self._workload_done():
                upcoming = min(
                    upcoming, self._tick_at, self._readies[0][0] if self._readies else math.inf
                )
        return upcoming

    def _break_stalls(self) -> bool:
        """A dead end (requests in flight, nothing due): let stuck ranks admit past their
        waiting heads in their next pass (see :meth:`Worker.break_stall`); whether any
        could. Once an instant: a dead end that doing so left as it was is final."""
        if not self.ledger.in_flight or self._stalls_broken_at == self.now:
            return False
        self._stalls_broken_at = self.now
        woke = False
        for pool in self.flow.pools:
            for worker_id, worker in enumerate(pool.workers):
                if not worker.busy and worker.break_stall():
                    pool.wake(worker_id)
                    woke = True
        if woke:
            self._settle()
        return woke

    def _workload_done(self) -> bool:
        return not self.ledger.in_flight and self.admission.drained()

    def _advance(self, upcoming: float) -> None:
        # Cost charges the provisioned workers from one instant a run without telemetry
        # has to the next (so sampling leaves it unchanged), at the counts that hold when
        # the clock leaves it; it is summed only when a count changes (and at the end), so
        # that how many instants a run visits (its windows) does not move its last bits.
        if self._split_ends and not self._natural(upcoming):
            self.now = upcoming
            return
        if self.scaling is not None:
            counts = tuple(pool.provisioned for pool in self.flow.pools)
            if counts != self._priced_counts:
                self._charge(self._last_natural)
                self._priced_counts = counts
        self.now = self._last_natural = upcoming

    def _charge(self, until: float) -> None:
        """Charge the counts priced since ``_priced_ms`` up to ``until``."""
        dt = (until - self._priced_ms) / 1000.0
        for pool, count in zip(self.flow.pools, self._priced_counts, strict=True):
            self._worker_seconds[pool.stage] += dt * count
        self._priced_ms = until

    def _natural(self, at: float) -> bool:
        """Whether the timestamp ``at`` exists without telemetry (not only a split window's end)."""
        split = self._split_ends
        natural = any(entry[0] == at and entry not in split for entry in self._completions)
        split.difference_update([entry for entry in split if entry[0] <= at])
        return (
            natural
            or self._tick_at == at
            or (bool(self._readies) and self._readies[0][0] == at)
            or max(self.admission.ready_ms, self.now) == at
            or (bool(self._deadlines) and self._deadlines[0][0] == at)
            or self.flow.next_deadline() == at
        )

    # ----- telemetry -----

    def _sample_due(self, telemetry: Telemetry, upcoming: float) -> None:
        """Take the sample due at ``telemetry.next_ms`` (at most ``upcoming``)."""
        due = telemetry.next_ms
        if self._split_windows(due):
            return  # a window now ends by the sample: the loop settles its end first
        if due == upcoming:
            self._advance(due)
            self._settle()  # which samples at the end of its first round
        else:
            self.now = due  # between timestamps: observe only
            telemetry.periodic(due, *self._observed())

    def _split_windows(self, at: float) -> bool:
        split = False
        for pool in self.flow.pools:
            for worker in pool.workers:
                end = pool.split_at(worker.worker_id, at) if worker.busy else None
                if end is not None:
                    self._split_ends.add((end, pool.stage, worker.worker_id))
                    split = True
        return split

    # ----- scaling -----

    def _run_ticks(self) -> None:
        """The first tick, when it is due at the start (the others come in :meth:`_settle`)."""
        if self._tick_at == self.now and self._tick_due():
            self._settle()

    def _tick_due(self) -> bool:
        """Take the tick due now; whether it was taken (once the workload is done, ticks
        stop)."""
        if self._workload_done():
            self._tick_at = math.inf
            return False
        self._tick()
        return True

    def _tick(self) -> None:
        assert self.scaling is not None
        decision = self.scaling.on_tick(
            ScalingSnapshot(ordinal=self._ticks, now_ms=self.now, pools=dict(self._pools))
        )
        self._ticks += 1
        for stage, target in sorted(decision.targets.items()):
            self._scale(self._pools[stage], target)
        after = decision.next_tick_ms
        self._tick_at = after if math.isfinite(after) and after > self.now else math.inf

    def _scale(self, pool: Pool, target: int) -> None:
        startup_s = pool.workers[0].config.startup_time or 0.0
        startup_ms = startup_s * 1000.0
        for worker_id in pool.scale_to(target, self.now, startup_ms):
            heapq.heappush(self._readies, (self.now + startup_ms, pool.stage, worker_id))
        self._scaled = True
        self.flow.set_routable(pool, self.now)

    def _apply_readies(self, now: float) -> bool:
        readies, changed = self._readies, False
        while readies and readies[0][0] == now:
            _, stage, worker_id = heapq.heappop(readies)
            pool = self._pools[stage]
            if pool.ready(worker_id, now):  # a cancelled startup's readiness is stale
                self.flow.set_routable(pool, now)
                pool.wake(worker_id)
                changed = True
        return changed

    def _remove_drained(self, now: float) -> bool:
        changed = False
        for pool in self.flow.pools:
            if pool.remove_drained(now):
                self.flow.set_routable(pool, now)
                changed = True
        return changed

    def transitions(self) -> list[Transition]:
        """Every pool's lifecycle changes, in time order (stable: prefill before decode)."""
        return sorted(
            (t for pool in self.flow.pools for t in pool.transitions), key=lambda t: t.at_ms
        )

    def _observed(self) -> tuple[dict[str, PoolView], tuple[int, int]]:
        views = {
            "prefill" if pool.stage is Stage.PREFILL else "decode": pool.view()
            for pool in self.flow.pools
        }
        return views, self.flow.router_pending()

    def _outcome(self, *, time_limited: bool) -> RunOutcome:
        if self.telemetry is not None:
            self.telemetry.final(self.now, *self._observed())
        self.ledger.collector.committed_prefill_tokens = sum(
            rank.committed_prefill_tokens
            for pool in self._pools.values()
            for worker in pool.workers
            for rank in worker.ranks
        )
        self._charge(self._last_natural)
        return RunOutcome(
            final_ms=self.now, time_limited=time_limited, worker_seconds=dict(self._worker_seconds)
        )

    # ----- settle loop -----

    def _settle(self) -> None:
        now = self.now
        completions, admission, pools = self._completions, self.admission, self.flow.pools
        wakeables = self._wakeables
        # The telemetry sample and then the scaling tick due now end the instant's first
        # round, as the reference's settle loop has them: what that round released but has
        # not placed yet (a disaggregated request's first handoff action) is placed in the
        # next round (on the pools the tick left).
        telemetry = self.telemetry
        sample = telemetry is not None and telemetry.next_ms == now
        tick = self._tick_at == now
        timed, flow_timers = self._timed, self._flow_timers
        driven = False
        disk = self._disk
        if disk:
            self._begin_drives(now)
        while True:
            # Each step is skipped when a look shows it has nothing to do (the last
            # round, which confirms that nothing changed, is most of them).
            changed = (
                bool(completions) and completions[0][0] == now and self._apply_completions(now)
            )
            if timed:
                if self._deadlines and self._deadlines[0][0] == now:
                    changed |= self._apply_own_work(now)
                if self._readies and self._readies[0][0] == now:
                    changed |= self._apply_readies(now)
            if flow_timers:
                changed |= self.flow.settle(now, workers_driven=driven)
            if admission.ready_ms <= now:
                changed |= self._release_arrivals(now)
            if disk:
                changed |= self._drive_disk_workers(now, changed)
            elif any(wakeables):
                changed |= self._start_passes(now)
            driven = True
            if timed:
                if self._scaled:
                    removed = self._remove_drained(now)
                    changed |= removed
                    self._round_changed |= removed  # (read with a disk tier only: a drive more)
                if sample:
                    sample = False
                    assert telemetry is not None
                    telemetry.periodic(now, *self._observed())
                if tick:
                    tick = False
                    ticked = self._tick_due()
                    changed |= ticked
                    self._round_changed |= ticked  # (likewise)
            if not changed:
                if self._shared_own_work:
                    for pool in pools:
                        for worker_id, worker in enumerate(pool.workers):
                            if not worker.busy:
                                self._watch_own_work(pool, worker_id)
                return

    def _apply_completions(self, now: float) -> bool:
        completions = self._completions
        changed = False
        while completions and completions[0][0] == now:
            _, stage, worker_id = heapq.heappop(completions)
            pool = self._pools[stage]
            worker = pool.workers[worker_id]
            if worker.busy_until != now:
                continue  # stale: its fast-forward window was cut to end earlier
            pool.wake(worker_id)
            self.flow.on_pass_end(pool, worker, worker.finish_pass(), now)
            changed = True
        return changed

    def _apply_own_work(self, now: float) -> bool:
        deadlines, changed = self._deadlines, False
        while deadlines and deadlines[0][0] == now:
            _, stage, worker_id = heapq.heappop(deadlines)
            if self._wakes.get((stage, worker_id)) == now:
                del self._wakes[stage, worker_id]
            pool = self._pools[stage]
            worker = pool.workers[worker_id]
            if worker.busy:
                continue  # a pass is in flight: its end completes what is due
            if worker.next_internal_deadline() > now:
                # Not due yet (another worker's look moved a shared tier's events): wait on.
                self._watch_own_work(pool, worker_id)
                continue
            worker.process_internal(now)
            self.flow.on_own_work(pool, worker, now)
            pool.wake(worker_id)
            changed = True
        return changed

    def _watch_own_work(self, pool: Pool, worker_id: int) -> None:
        """An idle worker: make sure the loop wakes it at its own next deadline (now, if
        that has passed: a copy shared with other workers completed while it waited)."""
        at = max(pool.workers[worker_id].next_internal_deadline(), self.now)
        key = (pool.stage, worker_id)
        if at < math.inf and self._wakes.get(key) != at:
            self._wakes[key] = at
            heapq.heappush(self._deadlines, (at, pool.stage, worker_id))

    def _release_arrivals(self, now: float) -> bool:
        released = self.admission.release(now)
        collector = self.ledger.collector
        for window in self.ledger.windows:
            window.arrivals += len(released)
        for item in released:
            spec = item.spec
            record = collector.on_arrival(
                spec.input_length,
                spec.output_length,
                item.arrival_ms,
                spec.session_id,
                spec.turn_index,
                request_id=spec.request_id,
                play_id=spec.trajectory,
                agentic=spec.agentic,
            )
            self.ledger.open(record, item)
            self.flow.admit(record, item, now)
        return bool(released)

    def _start_passes(self, now: float) -> bool:
        started = False
        for pool in self.flow.pools:
            wakeable = pool.wakeable
            if not wakeable:
                continue
            # Lowest worker id first (a sort only when there is a choice: it costs ten pops).
            order = sorted(wakeable) if len(wakeable) > 1 else (wakeable.pop(),)
            wakeable.clear()
            for worker_id in order:
                started |= self._start_pass(pool, worker_id, now)
        return started

    def _start_pass(self, pool: Pool, worker_id: int, now: float) -> bool:
        worker = pool.workers[worker_id]
        started = False
        while True:
            if not worker.can_start():
                if self._own_work and not worker.busy:
                    self._watch_own_work(pool, worker_id)
                return started
            quiet = None
            if worker.chain:
                # Before when nothing can reach the worker: the next arrival, or the next
                # pass end (which may end a request and release another; a stale one, of
                # a window cut shorter, only makes it earlier).
                completions, quiet = self._completions, self.admission.ready_ms
                if completions and completions[0][0] < quiet:
                    quiet = completions[0][0]
            begun = worker.start_pass(now, quiet)
            if begun is None:
                if self._own_work:
                    self._watch_own_work(pool, worker_id)
                return started
            end, admitted = begun
            self.flow.on_pass_start(pool, worker, admitted, now)
            if end > now:
                pool.schedule_end(worker_id, end)
                return True
            pool.wake(worker_id)
            self.flow.on_pass_end(pool, worker, worker.finish_pass(), now)
            if pool.stage is not Stage.DECODE:
                return True
            # A decode worker whose pass took no time (an SGLang rank re-admitting a
            # retracted request) starts its next pass at once, as the reference does:
            # a destination asked for then waits for that pass's end.
            pool.wakeable.discard(worker_id)
            started = True

    # ----- workers with a disk tier -----

    def _begin_drives(self, now: float) -> None:
        """A settle begins (with a disk tier): no round of it has changed anything yet.

        At a new instant the workers' runs of passes begin afresh, and a worker
        that found nothing to do is woken: the reference drives every ready
        worker again at each instant it settles (the lookups of its waiters,
        deferred on disk reads, count disk probes again).
        """
        self._round_changed = False
        if self._last_drive_at == now:
            return
        self._last_drive_at = now
        self._last_drive.clear()
        pool = self._pools[Stage.AGGREGATED]
        for worker_id, worker in enumerate(pool.workers):
            if worker.stalled and worker.found_nothing:
                pool.wake(worker_id)

    def _drive_disk_workers(self, now: float, changed: bool) -> bool:
        """A settle round's passes with a disk tier (``changed``: whether the round changed
        anything before them); whether any started or is to run again.

        A round after one that changed something is one more drive of the
        reference's ready workers. The workers woken go lowest id first, as in
        :meth:`_start_passes`.
        """
        if self._round_changed:
            self._drives += 1
        self._round_changed = changed
        pool = self._pools[Stage.AGGREGATED]
        wakeable = sorted(pool.wakeable)
        pool.wakeable.clear()
        started = False
        for worker_id in wakeable:
            started |= self._drive_disk_worker(pool, worker_id, now)
        return started

    def _drive_disk_worker(self, pool: Pool, worker_id: int, now: float) -> bool:
        """Start a pass of a worker with a disk tier; whether one started (or it is to run again).

        The reference drives its ready workers again after each pass with
        effects (one that takes time, admits or ends a request) and in each
        round of the instant after one that changed something. A worker that
        found nothing to do runs once more, in the next round, for each such
        drive since its last pass (its waiters' lookups count disk probes each
        time), and its run at this instant ends when there is none left. A pass
        that took no time and submitted a disk read, or finds a transfer due,
        counts as progress: it goes on at once (see
        :meth:`VllmScheduler.execute_pass`).
        """
        worker = pool.workers[worker_id]
        if not worker.can_start():
            if not worker.busy:
                self._watch_own_work(pool, worker_id)
            return False
        last = self._last_drive.setdefault(worker_id, self._drives)
        begun = worker.start_pass(now)
        if begun is None:
            # Drives since its last pass, the next round's counted when this one changed something.
            if worker.found_nothing and last < self._drives + self._round_changed:
                self._last_drive[worker_id] = last + 1
                pool.wake(worker_id)
                return True
            del self._last_drive[worker_id]
            self._watch_own_work(pool, worker_id)
            return False
        end, admitted = begun
        self.flow.on_pass_start(pool, worker, admitted, now)
        if end > now:
            del self._last_drive[worker_id]
            self._drive_again()
            pool.schedule_end(worker_id, end)
            return True
        pool.wake(worker_id)
        outputs = worker.finish_pass()
        if admitted or outputs.emitted or outputs.finished or outputs.rejected:
            self._drive_again()
        self.flow.on_pass_end(pool, worker, outputs, now)
        return True

    def _drive_again(self) -> None:
        """A pass with effects: the reference drives its ready workers again at once, and
        its round has changed something."""
        self._drives += 1
        self._round_changed = True

    def _deliver_windows_up_to(self, limit: float) -> None:
        """At a time cap, make visible the fast-forwarded tokens stamped by ``limit``."""
        for pool in self.flow.pools:
            for worker in pool.workers:
                if worker.busy:
                    self.flow.on_pass_end(pool, worker, worker.visible_by(limit), limit)
