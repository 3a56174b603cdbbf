"""vLLM-style scheduler of one DP rank (the reference's vLLM core).

One pass (:meth:`VllmScheduler.execute_pass`) is decided at its start:

1. Running loop: walk ``running`` in admission order while token budget
   remains; each request gets ``min(remaining known tokens, budget)`` (decode
   = 1 token, a prefill chunk otherwise). When blocks run out, preempt (LIFO:
   the newest running request; FIFO: the oldest) and retry; a blocked request
   stops the loop.
2. Waiting loop (only if nothing was preempted and fewer than
   ``max_num_seqs`` run): FIFO with head-of-line blocking. A request is
   admitted when the blocks its whole known sequence needs, less its active
   cached prefix, fit the non-active capacity; its resident cached prefix is
   reused, except the last block of a fully cached prompt (recompute rule).
3. Time: prefill of the batch's prompt chunks plus one decode step over the
   requests that were already decoding (or, re-admitted after a preemption,
   already had output); every token of the pass is stamped at
   ``now + prefill + decode``, each part rounded to whole nanoseconds.
4. Emission: every request whose sequence is fully computed emits one token;
   those reaching their output length finish and release their blocks.

**Decode cohort** (``lazy=True``, servesim's default mode). A running request
that decodes one token every pass needs no work in most passes: its length
follows from the rank's pass counter. Such *steady decoders* join the rank's
cohort after a pass in which they emitted their second or later token; a
member's progress is ``cohort_base`` plus the pass number, and it is visited
only in the passes where something happens to it: a block boundary (allocate
a block, cache a full one) or its last token (it leaves the cohort at that
pass's start and is scheduled as any other request). A pass whose members,
and the other running requests ahead of one, all fit its token budget and
whose new blocks all fit without preemption runs this way, with the other
requests and the members' events in running order, so block ids, evictions
and KV events are those of stepping; requests behind every member (prompts
being chunked) take what budget is left, in running order, as stepping
gives it.
Any other pass first materialises the cohort (:meth:`VllmScheduler._sync`)
and runs the loop above. Members' tokens are reported as one count per pass
(their shared gap), and each member's token count and last token time as a
catch-up when it leaves.

**Unnamed received prompts** (``anonymous_prompts``, a decode rank that
publishes nothing and reads nothing of its cache). A decode rank reuses the
resident prefix of a prompt it reserves, yet what it keeps cached shows only
when its KV runs short: a reuse then lets a reservation or a block fit that
would not fit otherwise. Until then the rank may keep every received prompt
as its request's own blocks, with no hash, no prefix look-up and no
per-block caching, release or eviction, and do exactly what it would do
with them named: shared blocks count once when named, so a named rank
always has at least the room an unnamed one has, and every allocation that
fits unnamed fits named. The first time the pool of such a rank refuses an
allocation (a reservation, or a block for a running request), it raises
:class:`NamedPromptsNeeded` and the replay is run again with the prompts
named; so does a pass it cannot run as a cohort for want of blocks (where a
named rank might, see :meth:`VllmScheduler._schedule_cohort`). A window it
stops short of a block it could not supply is followed by a refusal: its
members take that block in the next stepped pass, and none ends before.
"""

from __future__ import annotations

import heapq
import math
import operator
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from servesim.config import Backend, EngineConfig, Role
from servesim.engine.kv.block_pool import BlockPool, KvEvent
from servesim.engine.kv.hashing import chain, generated_block_hash
from servesim.engine.request import ALL_BLOCKS, EngineRequest, Status
from servesim.engine.roles import DestinationRole, SourceRole, make_role
from servesim.engine.scheduler import (
    CatchUp,
    DecodePlan,
    ForwardPass,
    Lookup,
    PassResult,
    RankGauges,
    population_var,
)
from servesim.engine.speculative import SpeculativeSampler
from servesim.engine.timing import TimingModel, decode_durations, pass_duration

if TYPE_CHECKING:
    from servesim.engine.host_offload import HostOffload
    from servesim.engine.kv.disk_tier import DiskTier
    from servesim.engine.kv.host_tier import HostTier

_UNBOUNDED = 1 << 62


class _Outcome(Enum):
    SCHEDULED = 0
    BLOCKED = 1
    CURRENT_PREEMPTED = 2


# Enum members as globals: the scheduler reads them per request, and a read through the
# class costs ~15x a global's (Python 3.11's EnumType.__getattr__ slows every class read).
_SCHEDULED, _BLOCKED = _Outcome.SCHEDULED, _Outcome.BLOCKED
_CURRENT_PREEMPTED = _Outcome.CURRENT_PREEMPTED
_WAITING, _RUNNING = Status.WAITING, Status.RUNNING
_PREEMPTED, _FINISHED = Status.PREEMPTED, Status.FINISHED


class NamedPromptsNeeded(Exception):
    """A decode rank keeping received prompts unnamed ran short of KV (see the module
    docstring): the replay must be run again with every received prompt named."""


class VllmScheduler:
    """Waiting and running queues, token budget and KV blocks of one rank."""

    # Slots, not a dict: past 30 attributes an instance's dict no longer shares its
    # class's keys, and CPython 3.11 then specialises no call of a method on it.
    __slots__ = (
        "__weakref__",
        "_asleep",
        "_batch",
        "_budget",
        "_caching",
        "_computes_prompt",
        "_connector",
        "_connector_queue",
        "_decodes",
        "_due",
        "_due_steps",
        "_emitting",
        "_fresh",
        "_last_member_seq",
        "_lifo",
        "_max_burst",
        "_max_seqs",
        "_max_tokens",
        "_members",
        "_no_evict",
        "_offload",
        "_others",
        "_recomputing",
        "_result",
        "_sampler",
        "_scheduled",
        "_seq",
        "_stall_broken",
        "_step",
        "_stretch_plans",
        "_sum_base",
        "_waited_step",
        "_window_durations",
        "anonymous_prompts",
        "block_size",
        "catch_ups",
        "committed_prefill_tokens",
        "config",
        "fpm",
        "last_emit_ms",
        "lazy",
        "measure_fpm",
        "pool",
        "preemptions_total",
        "role",
        "running",
        "timing",
        "waiting",
        "windows_span_finishes",
    )

    def __init__(
        self,
        config: EngineConfig,
        timing: TimingModel,
        *,
        events: list[KvEvent] | None = None,
        lazy: bool = False,
        rank_index: int = 0,
    ) -> None:
        self.config = config
        self.timing = timing
        self.block_size = config.block_size
        self.pool = BlockPool(
            config.num_gpu_blocks, events=events if config.enable_prefix_caching else None
        )
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.preemptions_total = 0
        # Tokens of the work items that computed prompt tokens (a recomputed output suffix
        # included when it rides along with prompt tokens), as the reference counts them.
        self.committed_prefill_tokens = 0
        # Its part in a P/D handoff (see servesim.engine.roles); a prefill rank charges
        # no decode time, a decode rank no prefill time (the prompt's KV is transferred).
        self.role = make_role(config.worker_type, self)
        self._computes_prompt = config.worker_type is not Role.DECODE
        self._decodes = config.worker_type is not Role.PREFILL
        self._max_seqs = config.max_num_seqs or _UNBOUNDED
        self._max_tokens = config.max_num_batched_tokens or _UNBOUNDED
        self._lifo = config.preemption_mode == "lifo"
        # TensorRT-LLM's GUARANTEED_NO_EVICT: admit against blocks to completion, never preempt.
        self._no_evict = config.backend is Backend.TRTLLM
        self._caching = config.enable_prefix_caching
        # Speculative decoding: each decode step emits a sampled burst of tokens, from a
        # generator seeded per rank as the reference seeds it (seed + rank index).
        self._sampler: SpeculativeSampler | None = None
        self._max_burst = 1
        if config.aic_nextn is not None:
            seed = (config.aic_mtp_seed + rank_index) & ((1 << 64) - 1)
            self._sampler = SpeculativeSampler(config.accept_rates, seed)
            self._max_burst = config.aic_nextn + 1 if self._decodes else 1
            lazy = False  # a member decodes one token a pass: bursts step every pass
        # Host offload (see servesim.engine.host_offload): requests deferred or parked by
        # the connector wait in _connector, ahead of ``waiting``; _asleep holds those that
        # wait for a transfer to complete. They are tried in the order of the reference's
        # FIFO of them, _connector_queue: a request joining it takes an entry at its tail,
        # and one leaving it takes its entry along only from the front, so that a request
        # that leaves from behind the front (admitted) leaves its entry there. Should it
        # join again (preempted, then put off), that entry is its place, ahead of the one
        # it takes at the tail. Entries of requests that left are dropped from the front
        # when the first awake request in it is picked by its place, as the reference
        # drops them (not when a disk tier's load owner is picked ahead of it).
        self._offload: HostOffload | None = None
        self._connector: list[EngineRequest] = []
        self._connector_queue: deque[EngineRequest] = deque()
        self._asleep: set[EngineRequest] = set()
        if config.native_host_offload is not None:
            # (Its module and the KV tiers under it load only for a run that has them.)
            from servesim.engine.host_offload import HostOffload

            assert config.kv_cache_bytes_per_token is not None
            self._offload = HostOffload(
                config.native_host_offload,
                self.block_size,
                config.kv_cache_bytes_per_token,
                events=self.pool.events,
            )
        # Decode cohort (see the module docstring). _step counts this rank's passes;
        # _others holds the running requests that are not members.
        self.lazy = lazy
        self._step = 0
        self._seq = 0
        self._members: dict[EngineRequest, None] = {}
        self._others: dict[EngineRequest, None] = {}
        self._sum_base = 0
        # No member was admitted after this (an upper bound: members leave, it stays).
        self._last_member_seq = -1
        self._due: dict[int, list[EngineRequest]] = {}  # members by their next event's pass
        self._due_steps: list[int] = []  # heap of _due's keys
        # Members that joined with their first token: their next one is their second.
        self._fresh: list[EngineRequest] = []
        # End of this rank's latest pass (set by its worker when the pass ends).
        self.last_emit_ms = 0.0
        # Members that left the cohort since the last call of take_catch_ups.
        self.catch_ups: list[CatchUp] = []
        self._window_durations: dict[tuple[int, int, int], np.ndarray] = {}
        # The latest stepped pass after which requests still waited (see plan_decode).
        self._waited_step = -1
        # Set at a dead end of the replay, for the next pass (see break_stall).
        self._stall_broken = False
        # Plans through finishes by their shape (see _plan_through_finishes).
        self._stretch_plans: dict[
            tuple[int, tuple[tuple[int, int], ...]], tuple[np.ndarray, list[tuple[int, int]]]
        ] = {}
        # Set by the worker when nothing outside the rank reacts to a request's end before
        # a window's end: windows may then run past members' last tokens (plan_decode).
        self.windows_span_finishes = False
        # Set by the worker on a decode rank whose cache nothing reads until its KV runs
        # short: received prompts then stay unnamed (see the module docstring).
        self.anonymous_prompts = False
        # Per-pass scratch state, reset by execute_pass.
        self._budget = 0
        self._batch = [0, 0, 0]  # prompts scheduled, sum of isl, sum of prefix
        self._scheduled: dict[EngineRequest, tuple[int, int, int]] = {}
        self._recomputing: list[EngineRequest] = []
        self._emitting: list[EngineRequest] = []
        self._result = PassResult(end_ms=0.0)
        # Forward-pass metrics (a planner reads them): measured when ``measure_fpm``
        # is set, the latest stepped pass's in ``fpm``.
        self.measure_fpm = False
        self.fpm = ForwardPass()

    # ----- public API -----

    def attach_shared_host(self, tier: HostTier, client: int) -> None:
        """Make this rank client ``client`` of the deployment's shared host tier."""
        assert self._offload is not None, "a shared host tier replaces the rank's own"
        self._offload.attach_shared(tier, client, self.pool)

    def attach_disk(self, disk: DiskTier, worker: int) -> None:
        """Put a disk tier under this rank's host tier (``worker``: its pool in the tier)."""
        assert self._offload is not None, "a disk tier needs a host tier"
        self._offload.attach_disk(disk, worker)

    def submit(self, request: EngineRequest) -> None:
        """Queue a new request at the back of waiting.

        Under TensorRT-LLM's no-evict policy a request's prompt and output must
        fit the rank's KV at once: its output is clamped to the room the prompt
        leaves in the KV and under ``max_model_len`` (a prompt that fills
        either is rejected at admission).
        """
        request.max_output = self._realisable_output(request)
        request.status = _WAITING
        self.waiting.append(request)
        if self._offload is not None:
            # Every prompt block may be offered to host and found there: all are named.
            request.named_blocks = ALL_BLOCKS
            full = request.prompt_len // self.block_size
            self._ensure_hashes(request, full)
            self._offload.track(request, request.hashes[:full])

    @property
    def host_tier(self) -> HostTier | None:
        """The host KV tier the rank offloads to (a shared one: the deployment's), if any."""
        return None if self._offload is None else self._offload.tier

    @property
    def kv_events(self) -> list[KvEvent] | None:
        """The KV events recorded since they were last taken (None: not recorded)."""
        return self.pool.events

    def has_work(self) -> bool:
        """Whether a pass could do anything."""
        return bool(self.running or self.waiting) or len(self._connector) > len(self._asleep)

    def never_fits(self, request: EngineRequest) -> bool:
        """Whether a fresh request can never be served here, however long it waits.

        Its prompt reaches ``max_model_len``; its known sequence needs more
        blocks than the rank has; or, without chunked prefill, its prompt
        exceeds the token budget of any pass.
        """
        max_len = self.config.max_model_len
        if max_len is not None and request.prompt_len >= max_len:
            return True
        if request.status is not _WAITING or request.num_computed:
            return False  # preempted, or prebuilt by a transfer: it fit before
        budget = self.config.max_num_batched_tokens
        computes_prompt = self._computes_prompt
        return -(-self._footprint(request) // self.block_size) > self.config.num_gpu_blocks or (
            computes_prompt
            and not self.config.enable_chunked_prefill
            and budget is not None
            and request.prompt_len > budget
        )

    # ----- the KV operations of its P/D role (servesim.engine.roles.RoleHost) -----

    def destination_slot_free(self) -> bool:
        """A reservation waits while ``max_num_seqs`` requests run."""
        return len(self.running) < self._max_seqs

    def cancel_reservation(self, request: EngineRequest) -> None:
        """Free the blocks reserved for a prompt whose transfer will not happen."""
        self.release_kv(request)

    def release_kv(self, request: EngineRequest) -> None:
        """Return a request's blocks; its computed full blocks stay cached (if caching)."""
        cached = request.num_computed // self.block_size if self._caching else 0
        self.pool.release(request.blocks, request.named_blocks, cached)

    def reserve_prompt(self, request: EngineRequest) -> tuple[int, int] | None:
        """Reserve the prompt's blocks, reusing a resident cached prefix; None if they do not fit.

        Returns:
            (reused prompt tokens, transferable tokens = fresh blocks x block size).
        """
        bs = self.block_size
        hits = 0
        request.max_output = self._realisable_output(request)
        if self._no_evict:
            # TensorRT-LLM reserves fresh blocks (no prefix credit), and only while the
            # request's whole footprint fits beside every promise already made.
            if -(-self._footprint(request) // bs) > self._no_evict_room():
                return None
        elif self.anonymous_prompts:
            request.named_blocks = 0  # its own blocks, unhashed, released as one run
        elif self._caching:
            if self._offload is not None:
                request.named_blocks = ALL_BLOCKS  # its prompt blocks may be stored to host
            limit = min(request.prompt_len // bs, request.named_blocks)
            self._ensure_hashes(request, limit)
            hits, _ = self.pool.match_prefix(request.hashes, limit)
        fresh = -(-request.prompt_len // bs) - hits
        if not self.pool.allocate(request.blocks, request.hashes[:hits], fresh):
            self._kv_short()
            return None
        if self._offload is not None and self._offload.copying_any(request.blocks[hits:]):
            # Never receive KV into blocks a store to host is still reading: retried
            # when a transfer completes.
            self.release_kv(request)
            return None
        request.pending_cached = hits * bs
        return hits * bs, fresh * bs

    def receive_prompt(self, request: EngineRequest, order: dict[int, int]) -> None:
        """The prompt's KV has arrived: make it cache-visible and queue the request to decode.

        It joins ``waiting`` ahead of the requests queued here after it (a
        shorter transfer activates a later request first; the earlier one still
        goes first).
        """
        request.num_computed = request.prompt_len
        full = request.prompt_len // self.block_size
        if self._caching and full:
            self._cache_blocks(request, request.pending_cached // self.block_size, full)
        if self._offload is not None:
            self._offload.track(request, request.hashes[:full])
        request.pending_cached = 0
        request.status = _WAITING
        mine = order[request.uid]
        waiting = self.waiting
        for index, other in enumerate(waiting):
            if order[other.uid] > mine:
                waiting.insert(index, request)
                return
        waiting.append(request)

    def execute_pass(self, now: float) -> PassResult:
        """Decide and apply one pass starting at ``now``; see the module docstring."""
        result = self._result = PassResult(now)  # (by position: docs/architecture.md)
        self._budget = self._max_tokens
        self._batch = [0, 0, 0]
        self._scheduled = {}
        self._recomputing = []
        self._step += 1
        cohort = bool(self._members) and self._schedule_cohort()
        if not cohort:
            self._sync(self._step - 1)
            self._schedule_running()
        offload = self._offload
        if offload is not None:
            reads = offload.reads_submitted  # (before this pass's waiting loop)
            self._schedule_waiting_offload(now)
            if cohort or self._scheduled:
                offload.rank_worked()
            for request in self.running:
                if request in self._scheduled:
                    offload.observe_computed(request, now)
        elif not result.preempted and len(self.running) < self._max_seqs:
            self._schedule_waiting()
        scheduled = self._scheduled_work() if self.measure_fpm else None
        result.end_ms = self._emit(now) if self._sampler is None else self._emit_bursts(now)
        if scheduled is not None:
            self.fpm = self._forward_pass(scheduled, (result.end_ms - now) / 1000.0)
        result.progressed |= bool(
            cohort or self._scheduled or result.finished or result.rejected or result.preempted
        )
        if offload is not None and offload.disk is not None and result.end_ms == now:
            # A pass that took no time is retried at once when it submitted a disk read or
            # a transfer is due, as the reference's is when its disk tier's epoch moved.
            result.progressed |= offload.reads_submitted != reads or offload.next_deadline() <= now
        if self.waiting:
            self._waited_step = self._step
        self._stall_broken = False
        return result

    def _scheduled_work(self) -> tuple[list[int], int, int, list[int]]:
        """The decided pass's work, as its FPM counts it: the prompt lengths of the requests
        computing prompt tokens, their tokens and the prompt tokens before them, and the
        sequence lengths of the decoding requests (cohort members at ``base + step + 1``)."""
        prompts: list[int] = []
        tokens = before = 0
        decodes: list[int] = []
        for request, (desired, prompt_before, prompt_tokens) in self._scheduled.items():
            if prompt_tokens > 0:
                prompts.append(request.prompt_len)
                tokens += desired
                before += prompt_before
            else:
                decodes.append(request.length)
        at = self._step + 1
        decodes += [request.cohort_base + at for request in self._members]
        return prompts, tokens, before, decodes

    def _forward_pass(
        self, work: tuple[list[int], int, int, list[int]], wall_time_s: float
    ) -> ForwardPass:
        """The FPM of a pass that scheduled ``work``, with the queue as it stands now."""
        prompts, tokens, before, decodes = work
        # Queued to prefill: fresh requests. Queued to decode: preempted ones (prompt plus
        # output), and on a decode rank every P/D destination by its prompt length (the
        # reference counts a destination so while it lives, preempted or not): waiting
        # to be admitted, in transfer, or not yet reserved.
        fresh: list[int] = []
        queued: list[int] = []
        role = self.role
        destination = isinstance(role, DestinationRole)
        for queue in (self._connector, self.waiting):
            for request in queue:
                if destination:
                    queued.append(request.prompt_len)
                elif request.status is _PREEMPTED:
                    queued.append(request.length)
                else:
                    fresh.append(request.prompt_len)
        if isinstance(role, DestinationRole):
            queued += [request.prompt_len for request in role.pending]
            queued += sorted(request.prompt_len for request in role.in_transfer)
        return ForwardPass(
            wall_time_s=wall_time_s,
            prefill_requests=len(prompts),
            prefill_tokens=tokens,
            prefill_length_var=population_var(prompts),
            prefill_kv_tokens=before,
            decode_requests=len(decodes),
            decode_kv_tokens=sum(decodes),
            decode_kv_var=population_var(decodes),
            queued_prefill=len(fresh),
            queued_prefill_tokens=sum(fresh),
            queued_prefill_var=population_var(fresh),
            queued_decode=len(queued),
            queued_decode_kv_tokens=sum(queued),
            queued_decode_var=population_var(queued),
        )

    def window_fpm(self, plan: DecodePlan, index: int, wall_time_s: float) -> ForwardPass:
        """The FPM of pass ``index`` of a window planned by :meth:`plan_decode` and not yet
        committed: every running request decodes, nothing waits."""
        at = plan.first_step + index + 1
        return self._forward_pass(
            ([], 0, 0, [request.cohort_base + at for request in self._members]), wall_time_s
        )

    def gauges(self) -> RankGauges:
        """See :class:`~servesim.engine.scheduler.RankScheduler`."""
        pool = self.pool
        return RankGauges(
            active_blocks=pool.num_active,
            inactive_blocks=pool.num_inactive_visible,
            total_blocks=pool.capacity,
            running=len(self.running),
            waiting=len(self.waiting) + len(self._connector),
            preemptions=self.preemptions_total,
        )

    # ----- decode fast-forward -----

    def plan_decode(self, limit: int) -> DecodePlan | None:
        """Plan up to ``limit`` passes that would each be one decode step for every running request.

        That holds while nothing waits (or what waits cannot be admitted before a
        member finishes, see :meth:`_waiting_blocked`, looked at once a stepped
        pass has left it waiting), every running request is a cohort member (a
        steady decoder joins after its next token), the token budget covers them
        all and the pool can give each block boundary a block without
        preempting. The plan stops at the pass in which the first member
        finishes, unless ``windows_span_finishes`` is set (nothing outside the
        rank reacts to a request's end before the window is applied) and nothing
        waits: then it runs on towards the last member's last token, in
        stretches of fewer members (see :meth:`_plan_through_finishes`). Returns
        None when fewer than two passes qualify (a normal pass is then as
        cheap). Planning changes nothing: a plan the worker drops (another rank
        could not plan) leaves no trace.
        """
        running = self.running
        if not running or len(running) > self._max_tokens:
            return None
        if self._connector or (self._offload is not None and not self._offload.idle()):
            return None  # a copy under way may complete, or fence a new block, mid-window
        if self.waiting and (self._waited_step != self._step or not self._waiting_blocked()):
            return None  # (a request that waits through a stepped pass may be blocked)
        if self._others:
            return None if self.waiting else self._plan_chunks(limit)
        members, step, bs = self._members, self._step, self.block_size
        n = len(members)
        finishes = [r.finish_step for r in members]
        first = min(finishes) - step
        passes = first if first < limit else limit
        pool = self.pool
        if self.windows_span_finishes and pool.events is None and not self.waiting:
            last = max(finishes) - step
            through = last if last < limit else limit
            if through > passes:
                return self._plan_through_finishes(through)
        # Pass j of the plan (step + 1 + j) gives a member a block when its
        # cohort_base + step + 1 + j is a multiple of bs. Which passes those are
        # matters only if the free blocks may run out (evictions, or preemption).
        needs: list[int] = []
        if n * (passes // bs + 1) > pool.num_free:
            needs = _block_passes(members, step, bs, passes)
            spare = pool.num_free + pool.num_inactive
            if len(needs) > spare:
                passes = needs[spare]
        if passes < 2:
            return None
        context = self._sum_base + n * (step + 2)  # the members' lengths before the first pass
        durations = self._decode_durations(n, context, passes)
        removals: list[tuple[int, int]] = []
        if pool.events is not None and needs:
            # Allocations past the free list evict the oldest inactive blocks, in order.
            evicting = needs[pool.num_free : bisect_left(needs, passes)]
            published = pool.removals_of_oldest(len(evicting))
            removals = [(j, h) for j, h in zip(evicting, published, strict=True) if h is not None]
        return DecodePlan(
            members=n,
            first_step=step + 1,
            prev_end_ms=self.last_emit_ms,
            seconds=list(self._fresh),
            durations=durations,
            removals=removals,
        )

    def _waiting_blocked(self) -> bool:
        """Whether no waiting request can be admitted before a running request ends.

        True when the running slots are full, or when the FIFO head does not fit
        (and would not be rejected): decode-only passes only take blocks (from
        the free list or by evicting, which can only shorten the head's cached
        prefix), so the head's admission check fails at each of them until a
        request ends and releases its blocks. Not on a decode rank (whose head
        depends on reservations and transfers) nor with connector copies; with a
        host tier, only while the head's lookup changes nothing (see
        :meth:`_offload_head_blocked`).
        """
        if self._connector or isinstance(self.role, DestinationRole):
            return False
        if len(self.running) >= self._max_seqs:
            return True
        if self._offload is not None:
            return self._offload_head_blocked()
        return self._admission(self.waiting[0]) is None

    def _offload_head_blocked(self) -> bool:
        """With a host tier of the rank's own and no disk under it, while no copy is
        under way (:meth:`plan_decode` looks first): whether the waiting head, looked
        up as the offload waiting loop does, would not fit, its lookup touching its
        host blocks as they already are.

        Its lookup then finds a run on host or none, never deferring, and it
        fits by the same count of blocks either way (a run's load takes as
        many GPU blocks as computing it), so it fails at each decode-only pass
        as without a tier. Nothing touches, stores or evicts a host block at
        those passes, so each of its lookups changes nothing. (Its touch must
        be a no-op from the first: the stepped pass after the window may
        preempt, and look nothing up.)
        """
        offload = self._offload
        assert offload is not None
        if offload.disk is not None or offload.tier.shared:
            return False  # (other workers' copies, and reads from disk, change the tier)
        request = self.waiting[0]  # (with no connector waiter, the loop's next request)
        if not offload.touched_last(request) or self.never_fits(request):
            return False
        full, raw, raw_active = self._gpu_prefix(request)
        _, active = self._offload_prefix(request, full, raw, raw_active)
        return self._offload_shortfall(request, active) > 0

    def _plan_chunks(self, limit: int) -> DecodePlan | None:
        """Up to ``limit`` passes in which the one running request that is not a member
        computes its prompt on, a full chunk a pass, and the members decode.

        Its chunk is the budget the members leave, as stepping gives it when it
        is the last running request. The plan stops before the pass of its last
        chunk (which emits its first token), at the pass in which the first
        member finishes, and before a pass whose new blocks the free and
        evictable blocks could not supply. Only without KV events, host or
        connector copies, speculative decoding and forward-pass metrics (whose
        passes would need more than a count of decoding members); None when
        fewer than two passes qualify.
        """
        running, members, step, pool = self.running, self._members, self._step, self.pool
        request = running[-1]
        if (
            len(self._others) != 1
            or request in members
            or request.generated
            or not request.num_computed
            or not self.config.enable_chunked_prefill
            or pool.events is not None
            or self._offload is not None
            or self._connector
            or self._sampler is not None
            or self.measure_fpm
        ):
            return None
        n, bs = len(members), self.block_size
        chunk = self._max_tokens - n
        left = request.prompt_len - request.num_computed
        passes = min(limit, -(-left // chunk) - 1)  # (chunk >= 1: the running fit the budget)
        if members:
            passes = min(passes, min(r.finish_step for r in members) - step)
        spare = pool.num_free + pool.num_inactive
        while passes >= 2:
            computed = request.num_computed + passes * chunk
            blocks = -(-computed // bs) - len(request.blocks)
            blocks += sum(
                len(range((-(r.cohort_base + step + 1)) % bs, passes, bs)) for r in members
            )
            if blocks <= spare:
                break
            passes -= 1
        if passes < 2:
            return None
        timing, computed = self.timing, request.num_computed
        prefill = np.zeros(passes)
        if self._computes_prompt:
            for j in range(passes):
                ms = timing.prefill_ms(1, computed + chunk, computed)
                prefill[j] = pass_duration(ms, timing.prefill_divisor)
                computed += chunk
        if n and self._decodes:
            decode = self._decode_durations(n, self._sum_base + n * (step + 2), passes)
        else:
            decode = np.zeros(passes)
        return DecodePlan(
            members=n,
            first_step=step + 1,
            prev_end_ms=self.last_emit_ms,
            seconds=list(self._fresh),
            durations=decode,
            removals=[],
            prompt=request,
            chunk=chunk,
            prefill_durations=prefill,
        )

    def _plan_through_finishes(self, passes: int) -> DecodePlan | None:
        """A plan of up to ``passes`` passes in which members may emit their last token
        before the last pass: after it, the others decode on, fewer and with less context.

        Each stretch of constant membership is priced as a window of its own is. The
        plan stops before a pass whose new blocks the free and evictable blocks could
        not supply without preempting (counting none of those the members leaving along
        the way release); None when fewer than two passes remain.
        """
        step, bs, pool = self._step, self.block_size, self.pool
        members = self._members
        spare = pool.num_free + pool.num_inactive
        if len(members) * (passes // bs + 1) > spare:
            needs = _block_passes(members, step, bs, passes)
            if len(needs) > spare:
                passes = needs[spare]
        if passes < 2:
            return None
        # Each member's passes to its last token and its length, both from this pass on:
        # the plan's shape, which a steady workload plans again and again. (A loop: a
        # comprehension would make ``step`` a cell, allocated at every call.)
        leaving = []
        for r in members:
            leaving.append((r.finish_step - step, r.cohort_base + step))  # noqa: PERF401
        leaving.sort()
        shape = (passes, tuple(leaving))
        priced = self._stretch_plans.get(shape)
        if priced is None:
            if len(self._stretch_plans) >= 256:
                self._stretch_plans.clear()
            priced = self._stretch_plans[shape] = self._price_stretches(*shape)
        durations, stretches = priced
        return DecodePlan(
            members=stretches[0][1],
            first_step=step + 1,
            prev_end_ms=self.last_emit_ms,
            seconds=list(self._fresh),
            durations=durations,
            removals=[],
            stretches=stretches,
        )

    def _price_stretches(
        self, passes: int, leaving: tuple[tuple[int, int], ...]
    ) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """The durations and stretches of ``passes`` passes of members that leave in the order
        of ``leaving``: (passes to its last token, its length before them) each, ascending.

        A pure function of its arguments (see :meth:`_plan_through_finishes`); read-only for
        callers.
        """
        n = len(leaving)
        lengths = sum(length for _, length in leaving)
        parts: list[np.ndarray] = []
        stretches: list[tuple[int, int]] = []
        start = 0
        # Each member ends a stretch with its last pass (none when it leaves in the same
        # pass as the one before it), then stops counting.
        for finish, length in leaving:
            if start >= passes:
                break
            end = min(finish, passes)  # the stretch's passes: start..end - 1
            if end > start:
                context = lengths + n * (start + 2)  # the members' lengths before it
                parts.append(self._decode_durations(n, context, end - start))
                stretches.append((end, n))
                start = end
            lengths -= length
            n -= 1
        if len(parts) == 1:
            return parts[0], stretches
        durations = np.concatenate(parts)
        durations.flags.writeable = False
        return durations, stretches

    def _commit_chunks(
        self, plan: DecodePlan, first: int, pass_ends: np.ndarray
    ) -> list[EngineRequest]:
        """Passes of a :meth:`_plan_chunks` plan, in stepping's order within each: the
        members' block boundaries, the prompt's chunk, then the members that finish."""
        request = plan.prompt
        assert request is not None
        finished = []
        due_steps = self._due_steps
        for step in range(first, first + len(pass_ends)):
            ending = []
            if due_steps and due_steps[0] == step:
                heapq.heappop(due_steps)
                ending = self._visit_due(step)
            self._budget = plan.chunk
            outcome = self._schedule(request, from_waiting=False)
            assert outcome is _SCHEDULED, "a chunk outran the pool"
            if ending:
                self._end_members(ending, step, float(pass_ends[step - first]))
                finished += ending
        self._step = first + len(pass_ends) - 1
        return finished

    def _commit_per_member(self, first: int, last: int) -> list[EngineRequest]:
        """Passes ``first..last`` of the cohort, member by member (see :meth:`commit_decode`)."""
        bs, pool = self.block_size, self.pool
        self._due.clear()
        self._due_steps.clear()
        finished = []
        for request in sorted(self._members, key=_admission_order):
            computed_before = request.cohort_base + first
            computed_after = request.cohort_base + last + 1
            new = -(-computed_after // bs) - len(request.blocks)
            if new > 0:
                ok = pool.allocate(request.blocks, [], new)
                assert ok, "the cohort outran the pool"
            if self._caching and computed_after // bs > computed_before // bs:
                self._cache_blocks(request, computed_before // bs, computed_after // bs)
            if request.finish_step == last:
                finished.append(request)
            else:
                self._schedule_due(request, last)
        return finished

    def _decode_durations(self, batch: int, context: int, passes: int) -> np.ndarray:
        """Durations of ``passes`` decode passes of ``batch`` requests from ``context`` tokens.

        A pure function of its arguments, remembered for the rank's recent windows: a
        steady workload plans the same windows again and again. Read-only for callers.
        """
        key = (batch, context, passes)
        durations = self._window_durations.get(key)
        if durations is None:
            if len(self._window_durations) >= 256:
                self._window_durations.clear()
            timing = self.timing
            durations = decode_durations(timing, batch, context, passes)
            durations.flags.writeable = False
            self._window_durations[key] = durations
        return durations

    def commit_decode(self, plan: DecodePlan, pass_ends: np.ndarray) -> list[EngineRequest]:
        """Apply the first ``len(pass_ends)`` passes of ``plan`` (ended at ``pass_ends``).

        The members' block boundaries are visited pass by pass, in running
        order, as stepping visits them, so block ids, evictions and KV events
        are identical. Without KV events, a window spanning a block or more
        gives each member its blocks at once instead: the blocks evicted are
        the same oldest ones, and only which member holds which id differs.

        A member finishes in the pass of its last token (with ``stretches``, before
        the last pass too), after that pass's new blocks and before the next's, as
        stepping releases its blocks; a plan with stretches is therefore visited
        pass by pass.

        Returns:
            The requests that finished, in the order they did.
        """
        passes = len(pass_ends)
        first, last = plan.first_step, plan.first_step + passes - 1
        self._fresh = []  # their second tokens are the plan's (see DecodePlan.seconds)
        if plan.prompt is not None:
            return self._commit_chunks(plan, first, pass_ends)
        if not plan.stretches and self.pool.events is None and passes >= self.block_size:
            finished = self._commit_per_member(first, last)
            self._step = last
            self._end_members(finished, last, float(pass_ends[-1]))
            return finished
        finished = []
        due_steps = self._due_steps
        while due_steps and due_steps[0] <= last:
            step = heapq.heappop(due_steps)
            ending = self._visit_due(step)
            if ending:  # (most steps only give members their next block)
                assert step == last or plan.stretches, "a plan ends with a last token"
                self._end_members(ending, step, float(pass_ends[step - first]))
                finished += ending
        self._step = last
        return finished

    def _visit_due(self, step: int) -> list[EngineRequest]:
        """The block boundaries of the members filed under pass ``step`` (then filed under
        their next one); returns those whose last token it is."""
        ending = []
        for request in self._take_due(step):
            if step == request.finish_step:
                self._block_events(request, step)
                ending.append(request)
            else:
                self._advance_member(request, step)
        return ending

    def _end_members(self, ending: list[EngineRequest], step: int, last_ms: float) -> None:
        """Members whose last token came in pass ``step`` (ended at ``last_ms``) leave and finish."""
        for request in ending:
            self._leave(request, step, last_ms)
            self._finish(request)

    # ----- decode cohort -----

    def take_catch_ups(self) -> list[CatchUp]:
        """Members that left the cohort since the last call (their tokens as members)."""
        out, self.catch_ups = self.catch_ups, []
        return out

    @property
    def passes(self) -> int:
        """Passes this rank has started (fast-forwarded ones not counted)."""
        return self._step

    def flush_cohort(self, passes_ended: int, last_ms: float) -> None:
        """Materialise every member as of this rank's first ``passes_ended`` passes, the last
        of which ended at ``last_ms`` (a time cap stops the run)."""
        self._sync(passes_ended, last_ms)

    def _schedule_cohort(self) -> bool:
        """The running loop of pass ``_step`` with the cohort kept lazy; False if it cannot be.

        It can when every member and every other running request ahead of a
        member in running order gets all the tokens it wants from the budget,
        and the pool supplies every new block without preempting: then order
        cannot change what they get. Requests behind every member (prompts
        being chunked) share what budget is left, in running order, as
        stepping gives it. Nothing is changed when False is returned.
        """
        step, bs, pool = self._step, self.block_size, self.pool
        members = self._members
        due = self._due.get(step, ())
        last_member = self._last_member_seq
        tokens = len(members)  # the members' and those of the requests ahead of one
        blocks = 0
        for request in self._others:
            if not request.blocks or not request.num_computed:
                return False
            length = request.prompt_len + request.generated
            if request.seq < last_member:
                tokens += length - request.num_computed
            blocks += max(0, -(-length // bs) - len(request.blocks))
        if tokens > self._budget:
            return False
        spare = pool.num_free + pool.num_inactive
        if blocks + len(due) > spare:  # (a due member needs one block at most: count them)
            for r in due:  # (a loop: a generator would make ``step`` and ``bs`` cells)
                if (r.cohort_base + step) % bs == 0:
                    blocks += 1
            if blocks > spare:
                self._kv_short()  # (stepping may leave the requests behind without budget)
                return False
        if due:
            self._take_due(step)  # (sorts them in running order)
            heapq.heappop(self._due_steps)
        emitting = self._emitting = []  # the non-members, in running order (see _emit)
        others = self._others
        self._budget -= len(members)  # each member's token, the leaving ones' last
        for request in sorted([*others, *due], key=_admission_order) if others else due:
            if request not in members:
                behind = request.seq > last_member  # behind every member: what budget is left
                if behind and not self._budget:
                    break  # (the running loop stops: so do the requests behind it)
                outcome = self._schedule(request, from_waiting=False)
                if behind and outcome is _BLOCKED:
                    break
                assert outcome is _SCHEDULED, "a cohort pass outran its budget or pool"
                emitting.append(request)
            elif step == request.finish_step:
                emitting.append(request)
                # Its last token: it leaves, decodes this pass as any other request would.
                self._leave(request, step - 1, self.last_emit_ms)
                self._block_events(request, step)
                request.num_computed += 1
                self._scheduled[request] = (1, -1, 0)
            else:
                self._advance_member(request, step)
        if self._fresh:  # (most passes have none: no comprehension to call)
            self._result.seconds = list(filter(members.__contains__, self._fresh))
            self._fresh = []
        return True

    def _take_due(self, step: int) -> list[EngineRequest]:
        """The members filed under ``step``, in running order (the bucket is removed)."""
        bucket = self._due.pop(step)
        if len(bucket) > 1:
            bucket.sort(key=_admission_order)
        return bucket

    def _advance_member(self, request: EngineRequest, step: int) -> None:
        """A member's block boundary in pass ``step``; then file it under its next one."""
        self._block_events(request, step)
        self._schedule_due(request, step)

    def _block_events(self, request: EngineRequest, step: int) -> None:
        """A member's new block for its token of pass ``step``, or its block becoming full."""
        bs = self.block_size
        computed = request.cohort_base + step  # before this pass's token
        if computed % bs == 0:
            ok = self.pool.allocate_one(request.blocks)
            assert ok, "the cohort outran the pool"
            if self._offload is not None:
                self._offload.fence_allocation(request.blocks[-1:])
        if self._caching and (computed + 1) % bs == 0:
            full = (computed + 1) // bs
            self._cache_blocks(request, full - 1, full)

    def _finish_step(self, request: EngineRequest) -> int:
        """The pass in which a member emits its last token."""
        base = request.cohort_base
        step = request.max_output + request.prompt_len - 2 - base
        max_len = self.config.max_model_len
        return step if max_len is None else min(step, max_len - 2 - base)

    def _schedule_due(self, request: EngineRequest, after: int) -> None:
        """File a member under its next pass after ``after`` with a block boundary or its end."""
        step = after + 1
        computed, bs = request.cohort_base + step, self.block_size
        ahead = -computed % bs  # to a new block for its token
        if ahead and self._caching and computed // bs < request.named_blocks:
            ahead -= 1  # the pass before, its block becomes full (if others may match it)
        due = step + ahead
        if due > request.finish_step:  # (not min(): three times a request)
            due = request.finish_step
        bucket = self._due.get(due)
        if bucket is None:
            self._due[due] = [request]
            heapq.heappush(self._due_steps, due)
        else:
            bucket.append(request)

    def _join(self, request: EngineRequest) -> None:
        """A running request that emitted in this pass joins the cohort."""
        if request.generated == 1:
            self._fresh.append(request)
        step = self._step
        request.cohort_base = request.num_computed - step - 1
        request.joined_step = step
        request.finish_step = self._finish_step(request)
        self._sum_base += request.cohort_base
        del self._others[request]
        self._members[request] = None
        if request.seq > self._last_member_seq:
            self._last_member_seq = request.seq
        self._schedule_due(request, step)

    def _leave(self, request: EngineRequest, passes_done: int, last_ms: float) -> None:
        """Materialise a member as of this rank's first ``passes_done`` passes (the last ended at ``last_ms``)."""
        del self._members[request]
        self._others[request] = None
        self._sum_base -= request.cohort_base
        request.num_computed = request.cohort_base + passes_done + 1
        request.generated = request.num_computed + 1 - request.prompt_len
        tokens = passes_done - request.joined_step  # < 0: joined in a pass that never ended
        if tokens > 0:
            self.catch_ups.append((request, tokens, last_ms))

    def _sync(self, passes_done: int, last_ms: float | None = None) -> None:
        """Materialise the whole cohort (a pass that must run request by request)."""
        if not self._members:
            return
        for request in list(self._members):
            self._leave(request, passes_done, self.last_emit_ms if last_ms is None else last_ms)
        self._last_member_seq = -1
        self._due.clear()
        self._due_steps.clear()
        self._fresh.clear()

    # ----- scheduling -----

    def _schedule_running(self) -> None:
        running = self.running
        i = 0
        while i < len(running) and self._budget > 0:
            request = running[i]
            outcome = self._schedule(request, from_waiting=False)
            if outcome is _BLOCKED:
                return
            if outcome is _SCHEDULED:
                i += 1
            # A preempted victim ahead of i (FIFO) shifts the list left; stay put otherwise.
            i = min(i, len(running))

    def _schedule_waiting(self) -> None:
        waiting, running, result = self.waiting, self.running, self._result
        while waiting and len(running) < self._max_seqs:
            request = self._waiting_head()
            if request is None:
                return
            cached = self._admission(request)
            if cached is None:
                return
            if cached < 0:
                waiting.remove(request)
                request.status = _FINISHED
                result.rejected.append(request)
                continue
            request.pending_cached = cached
            budget = self._budget
            if self._schedule(request, from_waiting=True) is not _SCHEDULED:
                return
            if budget == 0:
                # The loop goes on past a request that spent the budget, and stops after
                # one that took no tokens with none left: a prompt needing no tokens
                # (TensorRT-LLM reuses a fully cached prompt) is still admitted once.
                return

    def _schedule_waiting_offload(self, now: float) -> None:
        """The waiting loop with a host tier (see :mod:`servesim.engine.host_offload`).

        As :meth:`_schedule_waiting`, except: the first awake connector waiter
        goes before the FIFO head; after the GPU prefix match the request
        looks up its host run, and a hit reserves GPU blocks and starts a load
        instead of admitting (the request then waits for the load); a request
        the connector defers sleeps until some transfer completes. A hit must
        also fit beside the blocks running prefills and other loads will
        still need, and the loop stops once the token budget is spent.
        """
        offload = self._offload
        assert offload is not None
        running, result, bs = self.running, self._result, self.block_size
        reserved = sum(self._prefill_reservation(r) for r in running)
        reserved += offload.unreserved_tails()
        decode_rank = isinstance(self.role, DestinationRole)
        while not result.preempted and len(running) < self._max_seqs and self._budget > 0:
            # On a decode rank, a request whose KV arrived goes before anything else.
            prebuilt = (
                next((r for r in self.waiting if r.blocks and r.num_computed), None)
                if decode_rank
                else None
            )
            if prebuilt is not None:
                # Admitted as it is: its whole prompt is there, nothing to look up.
                prebuilt.pending_cached = 0
                if self._schedule(prebuilt, from_waiting=True) is not _SCHEDULED:
                    return
                prebuilt.host_reused = offload.on_admitted(prebuilt, 0)
                continue
            if decode_rank and not self._may_admit_others():
                return
            request = self._offload_next()
            if request is None:
                return
            before = self._prefill_reservation(request)
            # A prompt too long for the model is rejected before the lookup; one too
            # big for the KV cache after it (its lookup touches host recency), as the
            # reference orders its checks.
            max_len = self.config.max_model_len
            too_long = max_len is not None and request.prompt_len >= max_len
            load = offload.load_of(request)
            length = request.length
            keys: list[int] = []
            if too_long:
                verdict, g1 = Lookup.MISS, 0
            elif load is not None and load.activated:
                # Admission reuses exactly the prefix the load left it holding.
                g1 = active = raw = min(load.prefix_blocks, (length - 1) // bs)
                verdict = Lookup.MISS
            else:
                full, raw, raw_active = self._gpu_prefix(request)
                verdict, keys = offload.lookup(request, raw, now)
                if verdict is Lookup.DEFERRED:
                    self._sleep(request)
                    continue
                # The lookup leaves the GPU pool as it was.
                g1, active = self._offload_prefix(request, full, raw, raw_active)
            if too_long or self.never_fits(request):
                self._dequeue(request)
                request.status = _FINISHED
                offload.forget(request)
                result.rejected.append(request)
                continue
            short = self._offload_shortfall(request, active)
            if verdict is Lookup.HIT:
                short += reserved  # (beside what running prefills and loads still need)
            if short > 0:
                return
            if verdict is Lookup.HIT:
                if offload.loading_any(keys):
                    self._sleep(request)
                    continue
                if not self.pool.allocate(request.blocks, request.hashes[:raw], len(keys)):
                    return
                offload.start_load(request, keys, raw, now)
                reserved += self._prefill_reservation(request) - before
                self._sleep(request)
                result.progressed = True
                continue
            request.pending_cached = g1 * bs
            if self._schedule(request, from_waiting=True) is not _SCHEDULED:
                return
            request.host_reused = offload.on_admitted(request, g1 * bs)
            # Admitted: its load's tail is its running prefill's now.
            reserved += self._prefill_reservation(request) - before

    def _offload_prefix(
        self, request: EngineRequest, full: int, raw: int, raw_active: int
    ) -> tuple[int, int]:
        """The cached GPU prefix a host-tier admission reuses, and how many of its blocks
        are active: the lookup's match (``raw`` of the ``full`` named blocks, ``raw_active``
        active), cut to leave the prompt's last token to compute."""
        limit = min(full, (request.length - 1) // self.block_size)
        return (raw, raw_active) if raw <= limit else self.pool.match_prefix(request.hashes, limit)

    def _offload_shortfall(self, request: EngineRequest, active: int) -> int:
        """GPU blocks the request lacks to be admitted, or to load its host run, now
        (> 0: it does not fit), before the blocks running prefills and loads still need."""
        offload = self._offload
        assert offload is not None
        needed = -(-request.length // self.block_size) - max(
            active, offload.reserved_blocks(request)
        )
        return needed - (self.config.num_gpu_blocks - self.pool.num_active)

    def _offload_next(self) -> EngineRequest | None:
        """The next request the waiting loop tries with a host tier: the first awake
        connector waiter in the connector's FIFO (with a disk tier, one already holding
        GPU blocks for its load first), else the waiting head (None: nothing to try)."""
        offload = self._offload
        assert offload is not None
        connector, queue, asleep = self._connector, self._connector_queue, self._asleep
        if len(connector) == len(asleep):  # (every waiter there sleeps: _asleep is a subset)
            return self._waiting_head() if self.waiting else None
        if offload.disk is not None:
            for request in queue:
                if (
                    request in connector
                    and request not in asleep
                    and offload.reserved_blocks(request)
                ):
                    return request
        while queue[0] not in connector:
            queue.popleft()
        return next(r for r in queue if r in connector and r not in asleep)

    def _gpu_prefix(self, request: EngineRequest) -> tuple[int, int, int]:
        """The request's full named blocks and its cached GPU prefix of them, as a host
        lookup starts from it: (full blocks, hit blocks, how many hits are active)."""
        full = min(request.length // self.block_size, request.named_blocks)
        self._ensure_hashes(request, full)
        return (full, *self.pool.match_prefix(request.hashes, full))

    def _prefill_reservation(self, request: EngineRequest) -> int:
        """Blocks a request will still need for its prompt: a running chunked prefill's
        rest, or the tail beyond a host load's prefix."""
        offload = self._offload
        assert offload is not None
        blocks = offload.unreserved_tail(request)
        if request.status is _RUNNING and request.num_computed < request.prompt_len:
            blocks += max(0, -(-request.length // self.block_size) - len(request.blocks))
        return blocks

    def _sleep(self, request: EngineRequest) -> None:
        """Park a request with the connector until a transfer completes (keeping its place there)."""
        if request not in self._asleep and request not in self._connector:
            self.waiting.remove(request)
            self._connector.append(request)
            self._connector_queue.append(request)
        self._asleep.add(request)

    def _dequeue(self, request: EngineRequest) -> None:
        """Take a request out of whichever waiting queue holds it."""
        if self._connector and request in self._connector:
            self._connector.remove(request)
            self._asleep.discard(request)
            if self._connector_queue[0] is request:
                self._connector_queue.popleft()
        else:
            self.waiting.remove(request)

    # ----- engine-owned deadlines (host offload) -----

    def next_internal_deadline(self) -> float:
        """When this rank next has work of its own: a transfer completing (``math.inf``: none)."""
        return math.inf if self._offload is None else self._offload.next_deadline()

    def process_internal(self, now: float) -> None:
        """While idle, complete the transfers due by ``now``.

        (With a disk tier, the reference's idle rank also runs scheduler steps
        that find nothing to do around these completions, whose lookups count
        disk probes: the runtime drives the worker again for each, see
        :meth:`Runtime._drive_disk_worker`.)
        """
        if self._offload is not None:
            self._settle_transfers(*self._offload.advance(now))

    def complete_boundary(self, now: float) -> None:
        """A pass ended at ``now``: transfers due complete and the pass's stores start."""
        if self._offload is not None:
            self._settle_transfers(*self._offload.boundary(now))

    def _settle_transfers(self, loaded: list[EngineRequest], progressed: bool) -> None:
        for request in loaded:
            load = self._offload.load_of(request) if self._offload is not None else None
            assert load is not None
            if self._caching:
                self.pool.cache(
                    request.blocks, request.hashes, load.base_blocks, load.prefix_blocks
                )
        if progressed:
            self._asleep.clear()
            self.role.capacity_changed()  # a destination refused for a copy under way retries

    def _waiting_head(self) -> EngineRequest | None:
        """The next request to admit (None: admit nothing more this pass).

        FIFO, except on a decode rank while destination reservations wait in
        its queue: then only a prebuilt (activated) request may be admitted,
        the first one in waiting order, as the reference does.

        Where the reference would wait for ever, a stuck decode rank admits
        differently (see :meth:`break_stall`).
        """
        waiting = self.waiting
        head = waiting[0]
        destination = self.role
        if not isinstance(destination, DestinationRole):
            return head
        prebuilt = next((r for r in waiting if r.blocks and r.num_computed), None)
        stuck = self._stuck(destination)
        if destination.pending:
            return head if prebuilt is None and stuck else prebuilt
        if prebuilt is None or prebuilt is head or not stuck or self._admission(head) is not None:
            return head
        return prebuilt

    def _may_admit_others(self) -> bool:
        """On a decode rank: whether a request other than a prebuilt one may be admitted.

        Not while destination reservations wait, unless the rank is stuck (see
        :meth:`break_stall`), as :meth:`_waiting_head` decides.
        """
        destination = self.role
        assert isinstance(destination, DestinationRole)
        return not destination.pending or self._stuck(destination)

    def break_stall(self) -> bool:
        """The replay reached a dead end: let a stuck decode rank's next pass admit past it.

        A decode rank is stuck when nothing runs on it, nothing is in transfer
        to it and its waiting head cannot be admitted: nothing it holds will
        free blocks. The reference then waits until something reaches the rank
        (a reservation queued lets a prebuilt request pass the head), for ever
        if nothing does. servesim waits as long, and where nothing ever would,
        at the end of the replay's events, the rank's next pass admits
        differently: a prebuilt request passes the head (it holds all its own
        blocks), and with no prebuilt request the head is tried even while
        reservations wait.

        Returns:
            Whether the rank is a decode rank with work (one that may be stuck).
        """
        if not isinstance(self.role, DestinationRole) or not self.has_work():
            return False
        self._stall_broken = True
        return True

    def _stuck(self, destination: DestinationRole) -> bool:
        """Whether the rank may admit as a stuck one now (see :meth:`break_stall`)."""
        return self._stall_broken and not self.running and not destination.in_transfer

    def _admission(self, request: EngineRequest) -> int | None:
        """Cached prefix tokens to reuse if the request can be admitted now.

        Returns None to wait (head-of-line blocking) and -1 to reject a request
        that can never fit.
        """
        if request.blocks and request.num_computed:
            # Prebuilt on a decode rank: its blocks were reserved and filled by the transfer.
            return 0
        bs = self.block_size
        if self.never_fits(request):
            return -1
        hits = active_hits = 0
        if self._caching:
            # vLLM's recompute rule: the last token is always computed (its logits are
            # needed). TensorRT-LLM reuses every cached block.
            length = request.length
            limit = length // bs if self._no_evict else (length - 1) // bs
            if request.named_blocks < limit:
                limit = request.named_blocks
            self._ensure_hashes(request, limit)
            hits, active_hits = self.pool.match_prefix(request.hashes, limit)
            if self._sampler is not None and not self._no_evict and hits:
                # vLLM's MTP/Eagle rule: the drafter needs the last matched block's hidden
                # states, so that block is recomputed.
                hits -= 1
                active_hits = min(active_hits, hits)
        if self._no_evict:
            available = self._no_evict_room()
        else:
            available = self.config.num_gpu_blocks - self.pool.num_active
        if -(-self._footprint(request) // bs) - active_hits > available:
            return None
        return hits * bs

    def _no_evict_room(self) -> int:
        """Free blocks no request has been promised (TensorRT-LLM's no-evict accounting).

        Every running request keeps the blocks it still needs to finish, and so
        does every destination whose prompt KV is in transfer or has arrived
        but does not run yet.
        """
        promised = sum(self._blocks_to_finish(r) for r in self.running)
        if isinstance(self.role, DestinationRole):
            promised += sum(self._blocks_to_finish(r) for r in self.role.in_transfer)
            promised += sum(
                self._blocks_to_finish(r) for r in self.waiting if r.blocks and r.num_computed
            )
        return self.config.num_gpu_blocks - self.pool.num_active - promised

    def _realisable_output(self, request: EngineRequest) -> int:
        """The output a request may generate here: under no-evict, what the prompt leaves
        in the KV and under ``max_model_len`` (it reserves through completion)."""
        if not self._no_evict:
            return request.max_output
        room = self.config.total_kv_tokens - request.prompt_len
        max_len = self.config.max_model_len
        if max_len is not None:
            room = min(room, max_len - request.prompt_len)
        return min(request.max_output, room) if room > 0 else request.max_output

    def _footprint(self, request: EngineRequest) -> int:
        """Tokens the admission check reserves: the known sequence, or (no-evict) the whole request."""
        if self._no_evict:
            return request.prompt_len + self._realisable_output(request)
        return request.length

    def _blocks_to_finish(self, request: EngineRequest) -> int:
        """Blocks a running request still needs to reach its full length (no-evict)."""
        return max(0, -(-self._footprint(request) // self.block_size) - len(request.blocks))

    def _schedule(self, request: EngineRequest, *, from_waiting: bool) -> _Outcome:
        """Give a request its share of the budget and the blocks it needs."""
        bs = self.block_size
        cached = request.pending_cached if request.num_computed == 0 else 0
        computed_before = request.num_computed + cached
        prompt_len = request.prompt_len
        prompt_before = prompt_len if prompt_len < computed_before else computed_before
        remaining = request.length - computed_before
        budget = self._budget
        if not self.config.enable_chunked_prefill and prompt_len - prompt_before > budget:
            return _BLOCKED
        desired = budget if budget < remaining else remaining
        if desired == 0 and remaining > 0:
            return _BLOCKED
        target = computed_before + desired
        outcome = self._allocate(request, cached // bs, -(-target // bs))
        if outcome is not _SCHEDULED:
            return outcome
        request.num_computed = target
        full_before, full_after = computed_before // bs, target // bs
        if self._caching and full_after > full_before:
            self._cache_blocks(request, full_before, full_after)
        prompt_tokens = (prompt_len if prompt_len < target else target) - prompt_before
        batch = self._batch
        if prompt_tokens > 0:
            if request.generated:  # a preempted request recomputing prompt and output
                self._recomputing.append(request)
            self.committed_prefill_tokens += desired
            batch[0] += 1
            batch[1] += prompt_before + prompt_tokens
            batch[2] += prompt_before
        else:
            prompt_before = -1
        self._scheduled[request] = (desired, prompt_before, prompt_tokens)
        self._budget = budget - desired
        if from_waiting:
            self._dequeue(request)
            request.status = _RUNNING
            request.seq = self._seq
            self._seq += 1
            self.running.append(request)
            self._others[request] = None
            self._result.admitted.append((request, cached))
        return _SCHEDULED

    def _allocate(self, request: EngineRequest, prefix_blocks: int, total_blocks: int) -> _Outcome:
        """Grow the request's block table to ``total_blocks``, preempting others if needed."""
        pool = self.pool
        while True:
            if request.blocks:
                prefix: list[int] = []
                num_new = total_blocks - len(request.blocks)
            else:
                prefix = request.hashes[:prefix_blocks]
                num_new = total_blocks - prefix_blocks
            if num_new <= 0 and not prefix:
                return _SCHEDULED
            held = len(request.blocks) + len(prefix)
            if pool.allocate(request.blocks, prefix, num_new):
                if self._offload is not None:
                    # The reference hands an allocation's fresh capacity out last taken
                    # first (aisimulate's VllmBlockPool.allocate_private pops its
                    # reservation's tail: the last block it evicted goes to the first new
                    # position). Which position gets a block a store to host still reads
                    # decides which of the request's blocks it cannot store until the copy
                    # ends, so with a host tier the new blocks go in that order.
                    fresh = request.blocks[held:]
                    if len(fresh) > 1:
                        fresh.reverse()
                        request.blocks[held:] = fresh
                    self._offload.fence_allocation(fresh)
                return _SCHEDULED
            self._kv_short()
            victim = self._pick_victim()
            if victim is None:
                return _BLOCKED
            self._preempt(victim)
            if victim is request:
                return _CURRENT_PREEMPTED

    def _kv_short(self) -> None:
        """The pool refused blocks: a rank keeping received prompts unnamed cannot tell
        whether it would have with them named."""
        if self.anonymous_prompts:
            raise NamedPromptsNeeded

    def _pick_victim(self) -> EngineRequest | None:
        running = self.running
        if not running or self._no_evict:
            # No-evict admission reserves every request's blocks to completion, so
            # this is reached only where the reference logs a violation and waits.
            return None
        return running[-1] if self._lifo else running[0]

    def _cache_blocks(self, request: EngineRequest, start: int, end: int) -> None:
        """Cache the request's computed full blocks ``start..end`` that others may match.

        Blocks past ``named_blocks`` stay unhashed: the pool keeps them as the
        request's own until it releases them (see :meth:`release_kv`).
        """
        named_end = request.named_blocks if request.named_blocks < end else end
        if named_end > start:
            self._ensure_hashes(request, named_end)
            self.pool.cache(request.blocks, request.hashes, start, named_end)

    def _preempt(self, victim: EngineRequest, *, undo_commit: bool = True) -> None:
        """Send a running request back to the front of waiting; it recomputes through the cache.

        A victim scheduled earlier in this pass gives its work back, and (unless
        ``undo_commit`` is false: a preemption for the decode bursts, once the
        pass is decided) its committed prompt tokens.
        """
        full = victim.num_computed // self.block_size
        if self._caching and victim.named_blocks < full:
            # Its unnamed blocks are for its own re-admission to find: name them now.
            self._ensure_hashes(victim, full)
            self.pool.cache(victim.blocks, victim.hashes, victim.named_blocks, full)
        victim.named_blocks = ALL_BLOCKS
        if self._offload is not None:
            self._offload.on_preempted(victim)
        self.release_kv(victim)
        victim.num_computed = 0
        victim.pending_cached = 0
        victim.num_preemptions += 1
        victim.status = _PREEMPTED
        self.preemptions_total += 1
        assert not self._members, "a pass that may preempt runs with the cohort materialised"
        self.running.remove(victim)
        del self._others[victim]
        self.waiting.appendleft(victim)
        self._result.preempted.append(victim)
        undo = self._scheduled.pop(victim, None)
        if undo is not None:
            desired, prompt_before, prompt_tokens = undo
            self._budget += desired
            if prompt_before >= 0:
                if undo_commit:
                    self.committed_prefill_tokens -= desired
                batch = self._batch
                batch[0] -= 1
                batch[1] -= prompt_before + prompt_tokens
                batch[2] -= prompt_before

    # ----- timing and emission -----

    def _emit(self, now: float) -> float:
        """Price the pass, emit tokens and finish requests; return the pass end."""
        prefill = self._prefill_ms()
        ready: list[EngineRequest] = []
        decoding = context = 0
        scheduled = self._scheduled
        members = len(self._members)
        # Members emit as one count; the others in running order.
        candidates = self.running
        if members:  # a cohort pass: its other requests, then those admitted after them
            candidates = self._emitting  # (built for this pass: extended in place)
            for request, _ in self._result.admitted:
                candidates.append(request)
        for request in candidates:
            length = request.prompt_len + request.generated
            if request.num_computed != length:
                continue
            ready.append(request)
            # Decoding: it computed no prompt tokens this pass, or it already had output (a
            # preempted request re-admitted: its recompute pass also decodes, as the reference's).
            if request.generated or scheduled[request][1] < 0:
                decoding += 1
                context += length
        if members:
            decoding += members
            context += self._sum_base + members * (self._step + 1)
        decode = 0.0
        if decoding and self._decodes:
            decode = self.timing.decode_ms(decoding, context, context // decoding)
        end = self._pass_end(now, prefill, decode)
        result = self._result
        if members:
            result.cohorts.append((self.last_emit_ms, members))
        join = self.lazy and self._decodes
        offload = self._offload
        # Decode forwards (telemetry): the decoding requests but those recomputing their
        # prompt after a preemption (rare: counted only when there are any).
        forwards = decoding if self._decodes else 0
        if forwards and self._recomputing:
            forwards -= sum(1 for r in self._recomputing if r.num_computed == r.length)
        for request in ready:
            if request.generated < request.max_output:
                request.generated += 1
                result.emitted.append(request)
            if self._generation_complete(request):
                result.finished.append(request)
                self._finish(request)
            elif join and (offload is None or offload.stored(request)):
                # (With a host tier, once its prompt was offered to host: a member does
                # nothing per pass, so a store it still has to retry would be lost.)
                self._join(request)
        result.drafted = (forwards, forwards)
        return end

    def _prefill_ms(self) -> float:
        """The prefill time of the pass's prompt chunks (0 on a decode rank)."""
        n_prompts, sum_isl, sum_prefix = self._batch
        if not n_prompts or not self._computes_prompt:
            return 0.0
        return self.timing.prefill_ms(n_prompts, sum_isl // n_prompts, sum_prefix // n_prompts)

    def _pass_end(self, now: float, prefill: float, decode: float) -> float:
        """When a pass started at ``now`` ends: the reference rounds each part to whole
        nanoseconds, and decode starts at the prefill's end."""
        timing = self.timing
        if self._offload is not None:
            now = max(now, self._offload.fence)
        return (
            now
            + pass_duration(prefill, timing.prefill_divisor)
            + pass_duration(decode, timing.decode_divisor)
        )

    def _emit_bursts(self, now: float) -> float:
        """:meth:`_emit` with speculative decoding: each ready request emits a sampled burst.

        Blocks for every ready request's largest possible burst are taken
        first (preempting while they do not fit); every ready request counts in
        the decode step, the requests whose prefill completed in this pass
        included. A burst's tokens get their KV slots at once; all but the last
        count as computed. Returns the pass end.
        """
        prefill = self._prefill_ms()
        result = self._result
        for request in [r for r in self.running if self._generation_complete(r)]:
            if request.num_computed == request.length:
                result.finished.append(request)
                self._finish(request)
        bs = self.block_size
        reserved: list[int] = []
        while True:
            ready = [r for r in self.running if r.num_computed == r.length]
            needed = 0
            for request in ready:
                burst = min(self._max_burst, self._remaining(request))
                needed += -(-(request.length + burst) // bs) - -(-request.length // bs)
            if self.pool.allocate(reserved, [], needed):
                break
            self._kv_short()
            victim = self._pick_victim()
            if victim is None:
                return self._pass_end(now, prefill, 0.0)
            # The pass's prefill is priced already, and its committed prompt tokens stay
            # counted, the victim's too (the reference's committed_prefill_tokens).
            self._preempt(victim, undo_commit=False)
        decode = 0.0
        if ready and self._decodes:
            context = sum(r.length for r in ready)
            decode = self.timing.decode_ms(len(ready), context, context // len(ready))
        end = self._pass_end(now, prefill, decode)
        sampler = self._sampler
        assert sampler is not None
        bursts = []
        forwards = accepted = 0
        for request in ready:
            if not self._decodes:
                bursts.append(min(1, self._remaining(request)))
                continue
            bursts.append(sampler.burst(self._remaining(request)))
            if request.generated:  # a decode forward (a first burst comes from the prefill)
                forwards += 1
                accepted += sampler.accepted
        result.drafted = (forwards, accepted)
        result.bursts = True
        reserved.reverse()  # handed out in the order they were taken
        for request, burst in zip(ready, bursts, strict=True):
            for token in range(burst):
                # The previous token is computed now (its block may become full and
                # cached); the new one dangles, its slot taken from the reservation.
                length = request.length
                if token and self._caching and length % bs == 0:
                    self._cache_blocks(request, length // bs - 1, length // bs)
                request.num_computed = length
                request.generated += 1
                if len(request.blocks) * bs < request.length:
                    request.blocks.append(reserved.pop())
                result.emitted.append(request)
                if self._generation_complete(request):
                    result.finished.append(request)
                    self._finish(request)
                    break
        if reserved:
            self.pool.release(reserved, 0, 0)
        return end

    def _remaining(self, request: EngineRequest) -> int:
        """Tokens the request may still generate (its output length, and ``max_model_len``)."""
        left = request.max_output - request.generated
        max_len = self.config.max_model_len
        if max_len is not None:
            left = min(left, max_len - request.length)
        return max(left, 0)

    def _generation_complete(self, request: EngineRequest) -> bool:
        """``_remaining(request) == 0``, without its min and max: every ready request asks."""
        if request.generated >= request.max_output:
            return True
        max_len = self.config.max_model_len
        return max_len is not None and request.prompt_len + request.generated >= max_len

    def _finish(self, request: EngineRequest) -> None:
        request.status = _FINISHED
        self.running.remove(request)
        del self._others[request]
        if self._offload is not None:
            self._offload.forget(request)
        self.role.finished(request)

    def check(self) -> None:
        """Assert the pool's invariants given every block table of the rank's requests.

        The tables are those of waiting and running requests, of finished
        prefills holding their KV for a transfer, and of destinations whose
        transfer is under way.
        """
        role = self.role
        kept: list[EngineRequest] = []
        if isinstance(role, SourceRole):
            kept += role.held.values()
        if isinstance(role, DestinationRole):
            kept += role.in_transfer
        kept += self._connector
        tables = [r.blocks for r in (*self.running, *self.waiting, *kept)]
        if self._offload is not None:
            tables += self._offload.held_blocks()
        self.pool.check(tables)
        if self._offload is not None:
            self._offload.check()
        assert self.pool.num_active <= sum(len(t) for t in tables)

    def _ensure_hashes(self, request: EngineRequest, num_blocks: int) -> None:
        """Extend ``request.hashes`` to cover at least its first ``num_blocks`` full blocks.

        Prompt blocks come from the prompt's block hashes; blocks holding
        generated tokens are hashed from the request's known output tokens
        (``request.sequence``) or else from (request, block index).
        """
        hashes = request.hashes
        have = len(hashes)
        if have >= num_blocks:
            return
        bs = self.block_size
        known = request.sequence or request.prompt
        known_full = known.length // bs
        if have < known_full:
            hashes += known.sequence_hashes(bs, min(num_blocks, known_full))[have:]
        for j in range(len(hashes), num_blocks):
            parent = hashes[-1] if hashes else None
            hashes.append(chain(parent, generated_block_hash(request.salt, j)))


_admission_order = operator.attrgetter("seq")
"""A request's place in admission order (a sort key: attrgetter, a third of a function's cost)."""


def _block_passes(
    members: Iterable[EngineRequest], step: int, block_size: int, passes: int
) -> list[int]:
    """The passes of a plan of ``passes`` from pass ``step + 1`` on (0-based) in which a
    member gets a new block, ascending, once a block: none past a member's last token.

    (Not inline: a comprehension that reads its caller's locals makes them cells,
    allocated at every call of the caller, though this runs only when blocks may run out.)
    """
    return sorted(
        j
        for r in members
        for j in range(
            (-(r.cohort_base + step + 1)) % block_size,
            min(passes, r.finish_step - step),
            block_size,
        )
    )
