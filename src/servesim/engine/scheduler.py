"""What every rank scheduler (vLLM, SGLang) offers its worker, and what one pass reports.

A worker drives its ranks through :class:`RankScheduler`: queue requests, run
a pass at ``now`` and read its :class:`PassResult`; a scheduler that can
fast-forward decode-only stretches plans them (:class:`DecodePlan`, see
:mod:`servesim.engine.worker`), the others plan none. A vLLM rank's host tier
answers its waiting loop with a :class:`Lookup` (:mod:`servesim.engine.host_offload`,
which loads only for a run that has one).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import numpy as np

from servesim.engine.kv.block_pool import KvEvent
from servesim.engine.request import EngineRequest
from servesim.engine.roles import RankRole
from servesim.engine.timing import TimingModel


class Lookup(Enum):
    """What a waiting request's host lookup found."""

    MISS = 0
    HIT = 1
    DEFERRED = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardPass:
    """One pass's forward-pass metrics (FPM), as the reference's engines publish them.

    *Scheduled* counts the pass's work: prompt chunks (their tokens, the
    prompt tokens already computed or cached before them, the variance of
    their prompt lengths) and decode steps (each request's sequence length,
    prompt plus output so far). *Queued* counts what waits once the pass is
    decided: fresh requests (their prompt lengths) and preempted ones (their
    prompt plus output). Variances are population variances. An idle rank
    publishes zeros (with its worker's pass time, or none at all when a
    planner fills in an idle second).
    """

    wall_time_s: float = 0.0
    prefill_requests: int = 0
    prefill_tokens: int = 0
    prefill_length_var: float = 0.0
    prefill_kv_tokens: int = 0
    decode_requests: int = 0
    decode_kv_tokens: int = 0
    decode_kv_var: float = 0.0
    queued_prefill: int = 0
    queued_prefill_tokens: int = 0
    queued_prefill_var: float = 0.0
    queued_decode: int = 0
    queued_decode_kv_tokens: int = 0
    queued_decode_var: float = 0.0


def population_var(values: list[int]) -> float:
    """The population variance of ``values`` (0.0 for fewer than two), summed in sorted order
    so that the same values in any order give the same float."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return sum((v - mean) ** 2 for v in sorted(values)) / n


@dataclass(frozen=True, slots=True, kw_only=True)
class RankGauges:
    """A rank's scheduler gauges, as telemetry samples them.

    Attributes:
        active_blocks: KV blocks held by at least one request.
        inactive_blocks: cached blocks nobody holds (evictable).
        total_blocks: the rank's KV blocks.
        running: requests in the running batch.
        waiting: requests queued for admission (preempted ones included).
        preemptions: preemptions since the run began (an SGLang retraction is none:
            the reference's telemetry does not count it).
    """

    active_blocks: int
    inactive_blocks: int
    total_blocks: int
    running: int
    waiting: int
    preemptions: int


# Its own __init__: one a pass, at half the cost of the generated one (default factories).
@dataclass(slots=True, init=False)
class PassResult:
    """What one rank's pass did; its outputs become visible at ``end_ms``.

    Attributes:
        end_ms: when the pass ends (``== start`` for a pass that did nothing).
        admitted: (request, reused prefix tokens) admitted from waiting at the pass start.
        emitted: requests that produced one output token, stamped at ``end_ms``.
        finished: requests that reached their output length (their blocks are released).
        rejected: requests dropped because they can never fit.
        preempted: requests preempted (sent back to waiting) in this pass.
        progressed: whether the pass scheduled, emitted, finished or rejected anything.
        cohorts: decode-cohort members that emitted one token (not in ``emitted``),
            as (when their previous token was stamped, how many), one entry per
            previous-token time.
        seconds: the members among them for which it was their second token on this rank.
        bursts: whether ``emitted`` may list a request more than once (a
            speculative burst of tokens, all stamped at ``end_ms``).
        drafted: (decode request-forwards, tokens their steps accepted), when
            the rank counts them (None: the worker derives them from
            ``emitted``). A pass that computes a request's prompt (its first,
            or a recompute after a preemption) is no decode forward for it;
            a speculative step's accepted length counts in full even when
            the output ends sooner (as the reference's telemetry counts it).
        cache_tokens: (prefix-cache hit tokens, prompt tokens) of the pass's
            prefill chunks, as the reference's SGLang engine counts them for
            telemetry (a chunk counts its tokens, a request's first chunk its
            cached prefix too); the vLLM engine reports none.
    """

    end_ms: float
    admitted: list[tuple[EngineRequest, int]]
    emitted: list[EngineRequest]
    finished: list[EngineRequest]
    rejected: list[EngineRequest]
    preempted: list[EngineRequest]
    progressed: bool
    cohorts: list[tuple[float, int]]
    seconds: list[EngineRequest]
    bursts: bool
    drafted: tuple[int, int] | None
    cache_tokens: tuple[int, int]

    def __init__(self, end_ms: float) -> None:
        self.end_ms = end_ms
        self.admitted = []
        self.emitted = []
        self.finished = []
        self.rejected = []
        self.preempted = []
        self.progressed = False
        self.cohorts = []
        self.seconds = []
        self.bursts = False
        self.drafted = None
        self.cache_tokens = (0, 0)


CatchUp = tuple[EngineRequest, int, float]
"""A request leaving the decode cohort: (request, tokens it got as a member, last token time)."""


@dataclass(slots=True, kw_only=True)
class DecodePlan:
    """A rank's next passes when they are decode-only over its decode cohort.

    Attributes:
        members: how many requests decode (each gets a token every pass).
        first_step: the rank's pass number of the first planned pass.
        prev_end_ms: when the members' previous token was stamped.
        seconds: members whose token in the first planned pass is their second on this rank.
        durations: each planned pass's duration (ms, as the clock advances).
        removals: (pass index, hash) of the Removed events the plan's evictions
            publish at the start of that pass (only when KV events are recorded).
        stretches: when members finish before the plan's last pass (see
            :meth:`VllmScheduler.plan_decode`), the passes of constant membership
            as (end pass index, exclusive; members decoding in them), in order;
            empty: ``members`` decode in every pass.
        prompt: a request that computes ``chunk`` more prompt tokens in every
            planned pass, beside the members, and not its last ones (None: none).
        prefill_durations: then each pass's prefill part; ``durations`` is its
            decode part, and a pass ends at (start + prefill part) + decode part.
    """

    members: int
    first_step: int
    prev_end_ms: float
    seconds: list[EngineRequest]
    durations: np.ndarray
    removals: list[tuple[int, int]]
    stretches: list[tuple[int, int]] = field(default_factory=list)
    prompt: EngineRequest | None = None
    chunk: int = 0
    prefill_durations: np.ndarray | None = None


class RankScheduler(Protocol):
    """One DP rank's scheduler, as its worker drives it."""

    role: RankRole
    timing: TimingModel
    waiting: deque[EngineRequest]
    running: list[EngineRequest]
    committed_prefill_tokens: int
    last_emit_ms: float
    catch_ups: list[CatchUp]

    @property
    def kv_events(self) -> list[KvEvent] | None:
        """The KV events recorded since they were last taken (None: not recorded)."""
        ...

    @property
    def passes(self) -> int:
        """Passes this rank has run (its fast-forward clock)."""
        ...

    def submit(self, request: EngineRequest) -> None:
        """Queue a new request."""
        ...

    def has_work(self) -> bool:
        """Whether a pass could do anything."""
        ...

    def never_fits(self, request: EngineRequest) -> bool:
        """Whether a fresh request can never be served here, however long it waits."""
        ...

    def execute_pass(self, now: float) -> PassResult:
        """Decide and apply one pass starting at ``now``."""
        ...

    def plan_decode(self, limit: int) -> DecodePlan | None:
        """Up to ``limit`` decode-only passes to fast-forward, or None."""
        ...

    def commit_decode(self, plan: DecodePlan, pass_ends: np.ndarray) -> list[EngineRequest]:
        """Apply a plan's first ``len(pass_ends)`` passes, which ended at ``pass_ends``;
        return the requests that finished, in the order they did."""
        ...

    def take_catch_ups(self) -> list[CatchUp]:
        """Requests that left fast-forwarded decoding since the last call."""
        ...

    def gauges(self) -> RankGauges:
        """The rank's block and queue counts now (telemetry samples them)."""
        ...

    def check(self) -> None:
        """Assert the KV invariants against the requests the rank holds (tests call it)."""
        ...

    def next_internal_deadline(self) -> float:
        """When the rank next has work of its own, a KV transfer completing (``math.inf``: none)."""
        ...

    def process_internal(self, now: float) -> None:
        """While idle: complete the rank's own work due by ``now``."""
        ...

    def break_stall(self) -> bool:
        """The replay reached a dead end: for the next pass only, let the rank admit past
        a head that can never be admitted, where it can (see
        :meth:`servesim.engine.vllm.VllmScheduler.break_stall`). Whether it can."""
        ...

    def complete_boundary(self, now: float) -> None:
        """A pass ended at ``now``: complete the rank's own work due by then."""
        ...

    def flush_cohort(self, passes_ended: int, last_ms: float) -> None:
        """At a time cap: bring fast-forwarded requests' records up to ``passes_ended`` passes."""
        ...
