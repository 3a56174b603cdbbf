"""SGLang-style scheduler of one DP rank (the reference's SGLang core).

KV lives in a radix cache over pages of ``block_size`` tokens
(:class:`~servesim.engine.kv.radix_cache.RadixKvManager`); a request holds a
*lease* on its pages. One pass (:meth:`SglangScheduler.execute_pass`):

1. **Promote** prebuilt requests (a P/D destination whose prompt KV arrived)
   into ``running``, up to ``max_num_seqs``.
2. **LPM reorder** (policy ``lpm``, at most 128 waiting): by cached-prefix
   length, longest first; a request with a short match (<= 32 tokens) whose
   first pages duplicate an earlier waiting request's goes behind the rest.
3. **Prefill admission**, only while no prebuilt request waits for a slot and
   no destination reservation is pending. Requests leave ``waiting`` in order
   while the running cap, the token budgets and the KV allow; the budget of
   tokens is what is free or evictable less a reserve for the running
   requests' remaining output (``min(remaining, clip_max_new_tokens) x
   new_token_ratio``; on a DP worker's rank the ratio runs scaled by
   :data:`DP_RANK_RATIO_SCALE` until a retraction). A prompt larger than what is left of
   ``chunked_prefill_size`` is chunked (whole pages); a chunked request
   returns to the front of ``waiting`` with its complete pages cached.
4. **Prefill pass** (something was admitted): the prefill of the admitted
   chunks (batch size, mean end position, mean cached or own prefix) and
   nothing else: the requests whose prefill completed get their first token
   (produced by the prefill forward, at no decode cost; one that ends with
   it needs no KV slot) and join ``running``; the running requests wait.
5. **Decode pass** (nothing admitted): one decode step over every running
   request. Requests already at their output length finish without a token;
   while free plus evictable KV cannot take one more token per request, the
   request with the fewest output tokens (the first of equals) is
   *retracted*: its uncached pages are freed, it goes to the back of
   ``waiting`` with its outputs kept and recomputes through the cache, and
   ``new_token_ratio`` is re-estimated from the requests that stay. Each
   request then gets one token slot and one token; its completed pages enter
   the radix tree; a finished request caches its page-floored sequence and
   unlocks. ``new_token_ratio`` decays by its step after each decode pass,
   down to its floor.
6. **Run again** (by the worker, :meth:`~servesim.engine.worker.Worker.start_pass`): a
   pass that did nothing but decay the ratio is run again at the same instant, as
   long as that lowers it; the passes that would admit nothing are skipped, their
   steps taken at once (:meth:`SglangScheduler.ratio_steps_to_admit`).

Every token of a pass is stamped at its end.

**Decode cohort** (``lazy=True``): a running request that has emitted on the
rank is a member; its length is ``cohort_base`` plus the rank's count of
decode passes, and it is visited only at a decode pass where its token takes
a new page, completes one, or is its last (it leaves at that pass's start).
A decode-only stretch is planned as a fast-forward window
(:meth:`SglangScheduler.plan_decode`). Stepping (``lazy=False``) gives the
same results.

Decode time prices SGLang's *logical* KV: the sum of the batch's sequence
lengths (vLLM prices the physical active blocks). KV events, when recorded,
are published as the radix cache stores and removes pages.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from servesim.config import EngineConfig, Role
from servesim.engine.kv.block_pool import KvEvent
from servesim.engine.kv.hashing import generated_block_hash
from servesim.engine.kv.radix_cache import (
    DecodeReservation,
    DestinationReservation,
    RadixKvManager,
    RadixLease,
)
from servesim.engine.request import EngineRequest, Status
from servesim.engine.roles import DestinationRole, SourceRole, make_role
from servesim.engine.scheduler import CatchUp, DecodePlan, PassResult, RankGauges
from servesim.engine.speculative import SpeculativeSampler
from servesim.engine.timing import TimingModel, decode_durations, pass_duration

_UNBOUNDED = 1 << 62
LPM_FALLBACK_THRESHOLD = 128
"""Above this many waiting requests the ``lpm`` policy keeps FIFO order (as SGLang)."""
IN_BATCH_PREFIX_CHECK_THRESHOLD = 32
"""A waiting request matching at most this many cached tokens may be deprioritised."""
IN_BATCH_PREFIX_DEPRIORITIZE_THRESHOLD = 32
"""Tokens (rounded up to whole pages) whose duplicate in an earlier waiting request deprioritises."""
_NEW_TOKEN_RATIO_INIT = 0.7
_NEW_TOKEN_RATIO_FLOOR = 0.14
_NEW_TOKEN_RATIO_DECAY_PASSES = 600
RETRACT_DECODE_STEPS = 20
"""Decode steps of KV per surviving request that a retraction's ratio re-estimate assumes."""
DP_RANK_RATIO_SCALE = 0.3
"""On a worker of several DP ranks, ``new_token_ratio`` starts, decays and bottoms out at
this share of a lone rank's, as the reference's does, until a retraction re-estimates it
(unscaled): probed at 2 and 3 ranks, schedule conservativeness 0.5 to 2, before and
after hundreds of decode passes (``docs/reference-differences.md``)."""


class SglangScheduler:
    """Waiting, prebuilt and running requests and the radix KV cache of one rank."""

    # Slots, not a dict: past 30 attributes an instance's dict no longer shares its
    # class's keys, and CPython 3.11 then specialises no call of a method on it.
    __slots__ = (
        "__weakref__",
        "_caching",
        "_chunk",
        "_clip",
        "_computes_prompt",
        "_decode_index",
        "_decode_pending",
        "_due",
        "_due_steps",
        "_fresh",
        "_joined",
        "_last_decode_end",
        "_last_emit_ms",
        "_last_pass_decoded",
        "_lpm",
        "_max_burst",
        "_max_prefill",
        "_max_running",
        "_members",
        "_others",
        "_passes",
        "_prev_decode_end",
        "_ratio_before_pass",
        "_ratio_floor",
        "_ratio_step",
        "_reservations",
        "_sampler",
        "_seq",
        "_sum_base",
        "_survivors",
        "_unservable",
        "block_size",
        "catch_ups",
        "committed_prefill_tokens",
        "config",
        "kv",
        "lazy",
        "new_token_ratio",
        "prebuilt",
        "preemptions_total",
        "role",
        "running",
        "timing",
        "waiting",
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
        self._caching = config.enable_prefix_caching
        self.kv = RadixKvManager(
            config.num_gpu_blocks,
            config.block_size,
            events=events if self._caching else None,
            enable_prefix_caching=self._caching,
        )
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        # Destinations whose prompt KV arrived, waiting for a running slot.
        self.prebuilt: deque[EngineRequest] = deque()
        self.role = make_role(config.worker_type, self)
        self._computes_prompt = config.worker_type is not Role.DECODE
        self._max_running = config.max_num_seqs or _UNBOUNDED
        sglang = config.sglang
        self._lpm = sglang.schedule_policy == "lpm" and self._caching
        self._max_prefill = sglang.max_prefill_tokens
        # The reference divides the chunk among a worker's DP ranks, floored (not the
        # prefill budget, the running cap or the KV).
        self._chunk = sglang.chunked_prefill_size // config.dp_size
        self._clip = sglang.clip_max_new_tokens
        # A rank of a DP worker runs the ratio's schedule scaled down (its start, decay
        # step and floor); a retraction's re-estimate replaces it unscaled.
        scale = 1.0 if config.dp_size == 1 else DP_RANK_RATIO_SCALE
        init = _NEW_TOKEN_RATIO_INIT * sglang.schedule_conservativeness
        self.new_token_ratio = init * scale
        self._ratio_floor = init * _NEW_TOKEN_RATIO_FLOOR * scale
        self._ratio_step = (
            self.new_token_ratio - self._ratio_floor
        ) / _NEW_TOKEN_RATIO_DECAY_PASSES
        # Destination reservations by request, until the transfer activates them.
        self._reservations: dict[EngineRequest, DestinationReservation] = {}
        self.committed_prefill_tokens = 0
        self.preemptions_total = 0
        self._last_emit_ms = 0.0
        self.catch_ups: list[CatchUp] = []
        self._passes = 0
        self._survivors: list[EngineRequest] = []
        self._unservable: list[EngineRequest] = []
        # Speculative decoding: decode steps emit sampled bursts (prefill passes do not),
        # from a generator seeded per rank as the reference seeds it (seed + rank index).
        self._sampler: SpeculativeSampler | None = None
        self._max_burst = 1
        if config.aic_nextn is not None:
            seed = (config.aic_mtp_seed + rank_index) & ((1 << 64) - 1)
            self._sampler = SpeculativeSampler(config.accept_rates, seed)
            if config.worker_type is not Role.PREFILL:
                self._max_burst = config.aic_nextn + 1
            lazy = False  # a member decodes one token a pass: bursts step every pass
        # Decode cohort (see the module docstring): running requests that have emitted on
        # the rank. _decode_index counts decode passes.
        self.lazy = lazy
        self._decode_index = 0
        self._members: dict[EngineRequest, None] = {}
        self._others: list[EngineRequest] = []  # running, not members (in running order)
        self._seq = 0
        self._sum_base = 0
        self._due: dict[int, list[EngineRequest]] = {}
        self._due_steps: list[int] = []
        # Members by the time of their previous token: those that joined since the last
        # decode pass (their first or re-admission token), the rest at that pass's end.
        self._joined: dict[EngineRequest, float | None] = {}
        self._fresh: set[EngineRequest] = set()  # joined with their first token
        # Ends of the last two decode passes: a group pass's end (its slowest rank's),
        # known when the worker sets last_emit_ms (_decode_pending until then).
        self._last_decode_end = 0.0
        self._prev_decode_end: float | None = 0.0
        self._decode_pending = False
        self._last_pass_decoded = False
        self._ratio_before_pass = self.new_token_ratio

    # ----- what the worker drives (servesim.engine.scheduler.RankScheduler) -----

    @property
    def kv_events(self) -> list[KvEvent] | None:
        """The KV events recorded since they were last taken (None: not recorded)."""
        return self.kv.events

    @property
    def last_emit_ms(self) -> float:
        """End of this rank's latest pass (its worker's group pass end)."""
        return self._last_emit_ms

    @last_emit_ms.setter
    def last_emit_ms(self, end: float) -> None:
        """The worker ended a pass at ``end``: the times of tokens that came in it are known."""
        self._last_emit_ms = end
        if self._decode_pending:
            self._prev_decode_end, self._last_decode_end = self._last_decode_end, end
            self._decode_pending = False
        joined = self._joined
        for request, at in joined.items():
            if at is None:  # joined in the pass that just ended
                joined[request] = end

    @property
    def passes(self) -> int:
        """Passes this rank has run."""
        return self._passes

    def submit(self, request: EngineRequest) -> None:
        """Queue a new request at the back of waiting (one that can never run is rejected
        at the next pass start, as the reference does)."""
        request.status = Status.WAITING
        request.lease = RadixLease()
        self._cap_output(request)
        if self.never_fits(request):
            self._unservable.append(request)
        else:
            self.waiting.append(request)

    def has_work(self) -> bool:
        """Whether a pass could do anything."""
        return bool(self.running or self.waiting or self.prebuilt or self._unservable)

    def _cap_output(self, request: EngineRequest) -> None:
        """A request generates no further than ``max_model_len`` (its output is cut to fit)."""
        max_len = self.config.max_model_len
        if max_len is not None and request.prompt_len < max_len:
            request.max_output = min(request.max_output, max_len - request.prompt_len)

    def never_fits(self, request: EngineRequest) -> bool:
        """Whether a fresh request can never be served here: its prompt reaches
        ``max_model_len`` or its page-rounded prompt exceeds the rank's KV."""
        max_len = self.config.max_model_len
        if max_len is not None and request.prompt_len >= max_len:
            return True
        pages = -(-request.prompt_len // self.block_size)
        return pages > self.config.num_gpu_blocks

    def plan_decode(self, limit: int) -> DecodePlan | None:
        """Plan up to ``limit`` decode passes over the cohort, to be applied lazily.

        That holds while every running request is a member whose previous token
        came at the last decode pass, nothing waits to be admitted, no KV events
        are recorded, and the free and evictable pages cover every page the
        members' tokens need without a retraction. The plan ends with the pass
        in which the first member finishes. Planning changes nothing.
        """
        members = self._members
        if (
            not members
            or self.waiting
            or self.prebuilt
            or self._others
            or self._joined
            or self._unservable
            or self.kv.events is not None
            or (isinstance(self.role, DestinationRole) and self.role.pending)
        ):
            return None
        d, ps, n = self._decode_index, self.block_size, len(members)
        passes = min(limit, min(r.finish_step for r in members) - d + 1)
        room = (self.kv.available_tokens + self.kv.evictable_tokens) // ps
        if n * (passes // ps + 1) > room:
            # Pass j gives a member a page when its length before the token, cohort_base
            # + d + j, is a multiple of the page size; a pass whose pages would exceed
            # the room retracts, so the window stops before it.
            needs = sorted(
                j for r in members for j in range((-(r.cohort_base + d)) % ps, passes, ps)
            )
            if len(needs) > room:
                passes = needs[room]
        if passes < 2:
            return None
        durations = decode_durations(self.timing, n, self._sum_base + n * d, passes)
        return DecodePlan(
            members=n,
            first_step=d,
            prev_end_ms=self._last_decode_end,
            seconds=[],
            durations=durations,
            removals=[],
        )

    def gauges(self) -> RankGauges:
        """See :class:`~servesim.engine.scheduler.RankScheduler`: pages as blocks, every page
        in use active (the radix tree's cached pages included), as the reference counts them."""
        pool = self.kv.cache.pool
        return RankGauges(
            active_blocks=pool.total_pages - pool.num_free_pages,
            inactive_blocks=0,
            total_blocks=pool.total_pages,
            running=len(self.running),
            waiting=len(self.waiting) + len(self.prebuilt),
            preemptions=0,
        )

    def commit_decode(self, plan: DecodePlan, pass_ends: np.ndarray) -> list[EngineRequest]:
        """Apply the first ``len(pass_ends)`` passes of ``plan`` (ended at ``pass_ends``).

        The members' page events are visited pass by pass in running order, as
        stepping visits them, so pages, evictions and the radix tree are identical.

        Returns:
            The requests that finished in the last applied pass.
        """
        passes = len(pass_ends)
        last = plan.first_step + passes - 1
        end_ms = float(pass_ends[-1])
        kv, ps = self.kv, self.block_size
        finished: list[EngineRequest] = []
        steps = self._due_steps
        while steps and steps[0] <= last:
            d = steps[0]
            due = self._take_due(d)
            growth = ps * sum(1 for r in due if (r.cohort_base + d) % ps == 0)
            reservation = None
            if growth:
                shortfall = growth - kv.available_tokens
                if shortfall > 0:
                    kv.evict(shortfall)
                reservation = kv.reserve_decode_pages(growth // ps)
                assert reservation is not None, "the plan kept to the free and evictable pages"
            for request in due:
                self._decode_member(request, d, reservation)
                if request.finish_step == d:
                    assert d == last, "a plan ends with its first member's last token"
                    finished.append(request)
            if reservation is not None:
                kv.release_decode_reservation(reservation)
        self._decay_ratio(passes)
        self._passes += passes
        self._decode_index = last + 1
        self._last_decode_end = end_ms
        self._prev_decode_end = None  # the worker knows it (see flush_cohort)
        self._decode_pending = False
        self._last_pass_decoded = True
        for request in finished:
            self._depart(request)
            self._set_progress(request, last + 1)
            self.catch_ups.append((request, last + 1 - request.joined_step, end_ms))
            request.status = Status.FINISHED
            self.role.finished(request)
        if finished:
            self._remove_running(finished)
        return finished

    def take_catch_ups(self) -> list[CatchUp]:
        """Members that left the decode cohort since the last call."""
        out, self.catch_ups = self.catch_ups, []
        return out

    def flush_cohort(self, passes_ended: int, last_ms: float) -> None:
        """At a time cap: every member leaves, counting the tokens of the first ``passes_ended`` passes."""
        hidden = passes_ended < self._passes and self._last_pass_decoded
        visible = self._decode_index - hidden
        last = self._last_decode_end
        if hidden and not self._decode_pending:  # the hidden pass ended a window
            # Inside the window the worker has its previous pass end.
            last = last_ms if self._prev_decode_end is None else self._prev_decode_end
        for request in self._members:
            tokens = visible - request.joined_step
            if tokens > 0:
                self.catch_ups.append((request, tokens, last))
        self._members.clear()
        self._due.clear()
        self._due_steps.clear()
        self._joined.clear()
        self._fresh.clear()

    def execute_pass(self, now: float) -> PassResult:
        """Decide and apply one pass starting at ``now``; see the module docstring."""
        self._passes += 1
        self._ratio_before_pass = self.new_token_ratio
        result = PassResult(end_ms=now)
        if self._unservable:
            for request in self._unservable:
                request.status = Status.FINISHED
            result.rejected, self._unservable = self._unservable, []
        self._promote_prebuilt(result)
        if self._lpm:
            self._lpm_reorder()
        admitted: list[EngineRequest] = []
        sum_isl = sum_prefix = 0
        if self._admission_open():
            admitted, sum_isl, sum_prefix = self._admit(result)
        prefill = 0.0
        batch = len(admitted)
        if batch and self._computes_prompt:
            prefill = self.timing.prefill_ms(batch, sum_isl // batch, sum_prefix // batch)
        start = now + pass_duration(prefill, self.timing.prefill_divisor)
        if batch:
            prefilled = []
            for request in admitted:
                if request.num_computed < request.length:  # chunked: back to the front
                    self._cache_prefix(request)
                    self.waiting.appendleft(request)
                else:
                    prefilled.append(request)
            result.end_ms = self._first_tokens(prefilled, start, result)
            # Its tokens are first tokens (a retracted request's again too): no decode forward.
            result.drafted = (0, 0)
            for request in prefilled:
                self._enter_running(request)
        else:
            result.end_ms = self._decode_pass(start, result)
        self._last_pass_decoded = not batch and bool(result.emitted or result.cohorts)
        for request in result.finished:
            self._finish(request)
        self.waiting += result.preempted  # retracted: to the back, as SGLang re-queues them
        if result.preempted:
            self.new_token_ratio = self._retraction_ratio()
        elif not batch:  # the ratio decays on decode passes
            self._decay_ratio()
        result.progressed = bool(
            result.admitted or result.emitted or result.finished or result.rejected
        ) or bool(result.preempted or admitted or result.cohorts)
        if self._others:
            self._join_others(result)
        return result

    @property
    def ratio_lowered(self) -> bool:
        """Whether the last pass changed ``new_token_ratio`` (a decay step)."""
        return self.new_token_ratio != self._ratio_before_pass

    def ratio_steps_to_admit(self) -> int | None:
        """After a pass that made no progress: how many more decay steps (0 or more) of
        ``new_token_ratio`` let a repeat of the pass admit the waiting head, as far as the
        budgets of :meth:`_admit` go; None if none down to the floor does (or nothing
        can be admitted whatever the ratio)."""
        if not self._admission_open() or not self.waiting:
            return None
        if len(self.running) >= self._max_running:
            return None
        chunk = self._next_chunk(self.waiting[0], float(self._chunk), float(self._max_prefill))
        if chunk is None:
            return None
        need = chunk[3]
        total = self.kv.available_tokens + self.kv.evictable_tokens
        ratio, step, floor = self.new_token_ratio, self._ratio_step, self._ratio_floor
        steps = 0
        while need >= total - self._reserved_tokens(ratio):
            if ratio <= floor:
                return None
            ratio = max(ratio - step, floor)
            steps += 1
        return steps

    def decay_ratio_steps(self, steps: int | None) -> None:
        """Decay ``new_token_ratio`` by ``steps`` steps (None: all the way, to its floor;
        as :meth:`_decay_ratio`, a ratio already below the floor stays)."""
        if steps is None:
            self.new_token_ratio = min(self.new_token_ratio, self._ratio_floor)
        else:
            self._decay_ratio(steps)

    def _join_others(self, result: PassResult) -> None:
        """After a pass: running requests that emitted in it join the cohort (lazy mode)."""
        if not self.lazy:
            self._others = []
            return
        emitted = set(result.emitted)
        stay = []
        for request in self._others:
            if request.status is not Status.RUNNING:
                continue
            if request in emitted:
                self._join(request)
            else:
                stay.append(request)  # promoted, no token yet: it joins after one
        self._others = stay

    def _decay_ratio(self, passes: int = 1) -> None:
        """The ratio's decay over ``passes`` decode passes, step by step (as floats round)."""
        ratio, step, floor = self.new_token_ratio, self._ratio_step, self._ratio_floor
        while passes and ratio > floor:
            ratio = max(ratio - step, floor)
            passes -= 1
        self.new_token_ratio = ratio

    def _enter_running(self, request: EngineRequest) -> None:
        request.status = Status.RUNNING
        request.seq = self._seq
        self._seq += 1
        self.running.append(request)
        self._others.append(request)

    # ----- admission -----

    def _promote_prebuilt(self, result: PassResult) -> None:
        prebuilt, running = self.prebuilt, self.running
        while prebuilt and len(running) < self._max_running:
            request = prebuilt.popleft()
            self._enter_running(request)
            result.admitted.append((request, 0))

    def _lpm_reorder(self) -> None:
        """Longest cached prefix first; in-batch duplicates of a short match go last (stable)."""
        waiting = self.waiting
        if len(waiting) > LPM_FALLBACK_THRESHOLD:
            return
        ps = self.block_size
        duplicate_pages = -(-IN_BATCH_PREFIX_DEPRIORITIZE_THRESHOLD // ps)
        seen: set[tuple[int, ...]] = set()
        scored = []
        for index, request in enumerate(waiting):
            hashes = self._page_hashes(request)
            matched = self.kv.prefix_match_len(hashes)
            last = False
            if (
                matched <= IN_BATCH_PREFIX_CHECK_THRESHOLD
                and request.length >= duplicate_pages * ps
            ):
                prefix = tuple(hashes[:duplicate_pages])
                last = prefix in seen
                seen.add(prefix)
            scored.append((last, -matched, index, request))
        scored.sort(key=lambda item: item[:3])
        self.waiting = deque(item[3] for item in scored)

    def _admission_open(self) -> bool:
        """Whether a pass may admit from waiting: no prebuilt request waits for a running
        slot and no destination reservation is pending."""
        return not self.prebuilt and not (
            isinstance(self.role, DestinationRole) and self.role.pending
        )

    def _reserved_tokens(self, ratio: float) -> float:
        """The admission budget's reserve for the running requests' remaining output at
        ``ratio`` (``new_token_ratio``), summed in running order."""
        clip = self._clip
        reserved = 0.0
        for request in self.running:
            reserved += min(request.max_output - self._generated(request), clip) * ratio
        return reserved

    def _next_chunk(
        self, request: EngineRequest, rem_chunk: float, rem_input: float
    ) -> tuple[int, int, int, int] | None:
        """The next prefill chunk of a waiting ``request`` within what is left of the
        chunk and prefill budgets, as (its start, its tokens, its whole pages' tokens, the
        tokens it needs of the KV budget: those pages plus, when it completes the prompt,
        its output reserve). None when it takes none: nothing left to compute, no whole
        page left of the chunk, or its pages exceed the budgets.

        The KV budget check is the caller's: the chunk goes in when what it needs is
        below what is free or evictable less :meth:`_reserved_tokens` (less what earlier
        chunks of the pass took)."""
        ps = self.block_size
        materialized = request.num_computed
        length = request.length
        cached = 0
        if not materialized and self._caching:
            # The last token is always computed (its logits are needed).
            hashes = self._page_hashes(request)
            match_len = length if request.max_output == 0 else length - 1
            cached = self.kv.prefix_match_len(hashes, match_len // ps)
        start = max(materialized, cached)
        extend = length - start
        if extend == 0 and materialized:
            return None
        if -(-extend // ps) * ps <= rem_chunk:
            chunk = extend
        else:
            chunk = min(int(rem_chunk) // ps * ps, extend)
            if chunk == 0:
                return None
        charged = -(-chunk // ps) * ps
        if charged > rem_input or charged > rem_chunk:
            return None
        reserve = 0 if chunk < extend else min(request.max_output - request.generated, self._clip)
        return start, chunk, charged, charged + reserve

    def _admit(self, result: PassResult) -> tuple[list[EngineRequest], int, int]:
        """Admit prefill chunks from waiting; returns (requests, sum of chunk ends, sum of prefixes)."""
        waiting = self.waiting
        if not waiting:
            return [], 0, 0
        kv = self.kv
        rem_total = (kv.available_tokens + kv.evictable_tokens) - self._reserved_tokens(
            self.new_token_ratio
        )
        rem_input = float(self._max_prefill)
        rem_chunk = float(self._chunk)
        slots = self._max_running - len(self.running)
        admitted: list[EngineRequest] = []
        sum_isl = sum_prefix = 0
        while len(admitted) < slots and waiting:
            request = waiting[0]
            chunk = self._next_chunk(request, rem_chunk, rem_input)
            if chunk is None:
                break
            start, tokens, charged, need = chunk
            if need >= rem_total:
                break
            lease = request.lease
            assert lease is not None
            materialized = request.num_computed
            end = start + tokens
            self._ensure_page_hashes(request, end)
            if materialized:
                prefix = kv.extend(lease, end)
            else:
                prefix = kv.allocate(lease, end, match_limit=start)
            if prefix is None:
                break
            waiting.popleft()
            request.num_computed = end
            hits, total = result.cache_tokens
            result.cache_tokens = (
                hits + (0 if materialized else prefix),
                total + end - materialized,
            )
            if not materialized:
                result.admitted.append((request, prefix))
            self.committed_prefill_tokens += end - prefix
            admitted.append(request)
            sum_isl += end
            sum_prefix += prefix
            rem_total -= need
            rem_input -= charged
            rem_chunk -= charged
            if rem_chunk <= 0:
                break
        return admitted, sum_isl, sum_prefix

    # ----- decode -----

    def _first_tokens(self, batch: list[EngineRequest], start: float, result: PassResult) -> float:
        """The first token of each request whose prefill just completed (in place; no time).

        The prefill forward produced it: a request that ends with it needs no KV
        slot; the others get one (evicting cached pages if free ones are short).
        """
        self._finish_done(batch, result)
        last = [r for r in batch if r.max_output - r.generated == 1]
        if last:
            batch[:] = [r for r in batch if r.max_output - r.generated != 1]
            for request in last:
                request.generated += 1
                result.emitted.append(request)
            result.finished += last
        if batch:
            # When not even evicting makes room, the reference too leaves them without
            # their first token: they enter running and get it at the next decode pass.
            self._grow(batch, result)
        return start

    def _decode_pass(self, start: float, result: PassResult) -> float:
        """A pass that admitted nothing: one decode step over every running request."""
        if self._members:
            end = self._lazy_decode_step(start, result)
        else:
            end = self._decode_step(self.running, start, result)
        if result.emitted or result.cohorts:
            self._decode_index += 1
            self._decode_pending = True
        return end

    # ----- the decode cohort -----

    def _lazy_decode_step(self, start: float, result: PassResult) -> float:
        """:meth:`_decode_step` with the cohort members visited only at their events.

        A member's event is a token that needs a new page, completes a page, or
        is its last (it then leaves the cohort at the pass start). Falls back
        to stepping every request when a retraction may be needed.
        """
        d, ps, kv = self._decode_index, self.block_size, self.kv
        due = self._take_due(d)
        for request in due:
            if request.finish_step == d:
                self._leave(request, d)
        others = self._others
        done = self._finish_done(others, result)
        if done:
            self._remove_running(done)
        members = [r for r in due if r in self._members]
        crossing = sum(1 for r in members if (r.cohort_base + d) % ps == 0)
        growth = crossing * ps + self._page_growth(others)
        if kv.available_tokens + kv.evictable_tokens < growth:  # a retraction, or no room
            self._sync_all()
            return self._decode_step(self.running, start, result)
        count = len(self._members)
        total = self._sum_base + count * d + sum(r.length for r in others)
        batch = count + len(others)
        decode = self.timing.decode_ms(batch, total, total // batch)
        shortfall = growth - kv.available_tokens
        if shortfall > 0:
            kv.evict(shortfall)
        reservation = kv.reserve_decode_pages(growth // ps)
        assert reservation is not None, "free pages were made for the step"
        finished: list[EngineRequest] = []
        for request in sorted(members + others, key=_running_order) if others else members:
            if request in self._members:
                self._decode_member(request, d, reservation)
            else:
                self._decode_token(request, reservation, result, finished)
        kv.release_decode_reservation(reservation)
        if finished:
            self._remove_running(finished)
            result.finished += finished
        # Members' tokens: one count per previous-token time.
        last = self._last_decode_end
        groups: dict[float, int] = {}
        for at in self._joined.values():
            assert at is not None, "a member's previous token came at an ended pass"
            groups[at] = groups.get(at, 0) + 1
        stayed = count - len(self._joined)
        if stayed:
            groups[last] = groups.get(last, 0) + stayed
        result.cohorts += sorted(groups.items())
        result.seconds += [r for r in self._joined if r in self._fresh]
        self._joined.clear()
        self._fresh.clear()
        return start + pass_duration(decode, self.timing.decode_divisor)

    def _remove_running(self, requests: list[EngineRequest]) -> None:
        gone = set(requests)
        self.running = [r for r in self.running if r not in gone]

    def _generated(self, request: EngineRequest) -> int:
        """The request's output tokens now (a member's count is kept implicitly)."""
        if request in self._members:
            return request.cohort_base + self._decode_index - request.prompt_len
        return request.generated

    def _join(self, request: EngineRequest) -> None:
        """A running request that emitted in the pass now ending joins the cohort.

        Its token's time, the pass's group end, is known when the worker ends
        the pass (see the ``last_emit_ms`` setter).
        """
        d = self._decode_index
        request.cohort_base = request.length - d
        request.joined_step = d
        request.finish_step = d + request.max_output - request.generated - 1
        self._members[request] = None
        self._sum_base += request.cohort_base
        self._joined[request] = None
        if request.generated == 1:
            self._fresh.add(request)
        self._file(request, d)

    def _decode_member(
        self, request: EngineRequest, d: int, reservation: DecodeReservation | None
    ) -> None:
        """A member's token at decode pass ``d`` when it is an event (a page to take or complete).

        ``reservation`` holds the pages the pass's crossing tokens take (None: no token
        of the pass takes one).
        """
        lease = request.lease
        assert lease is not None
        length = request.cohort_base + d + 1  # after the token
        request.generated = length - request.prompt_len
        request.num_computed = length
        # RadixKvManager.extend_decode for one token, without its call on the window path.
        if (length - 1) % self.block_size == 0:
            assert reservation is not None
            lease.pages.append(reservation.take())
        lease.num_tokens = length
        if request.finish_step != d:
            if length % self.block_size == 0:  # the token completed a page
                self._cache_prefix(request)
            self._file(request, d + 1)

    def _depart(self, request: EngineRequest) -> None:
        del self._members[request]
        self._sum_base -= request.cohort_base
        self._joined.pop(request, None)
        self._fresh.discard(request)

    def _leave(self, request: EngineRequest, d: int) -> None:
        """A member leaves the cohort before decode pass ``d``, its progress caught up."""
        self._depart(request)
        tokens = d - request.joined_step
        self._set_progress(request, d)
        if tokens > 0:
            self.catch_ups.append((request, tokens, self._last_decode_end))
        self._others.append(request)
        self._others.sort(key=_running_order)

    def _sync_all(self) -> None:
        """Every member leaves (a pass that must step request by request)."""
        d = self._decode_index
        for request in list(self._members):
            self._leave(request, d)
        self._due.clear()
        self._due_steps.clear()

    def _set_progress(self, request: EngineRequest, d: int) -> None:
        """Bring a member's counters to where they stand before decode pass ``d``."""
        length = request.cohort_base + d
        request.generated = length - request.prompt_len
        request.num_computed = length
        lease = request.lease
        assert lease is not None
        lease.num_tokens = length

    def _file(self, request: EngineRequest, after: int) -> None:
        """File a member under its next event at decode pass ``after`` or later."""
        ps = self.block_size
        base = request.cohort_base
        crossing = after + (-(base + after)) % ps
        completing = after + (-(base + after + 1)) % ps
        step = min(crossing, completing, request.finish_step)
        bucket = self._due.get(step)
        if bucket is None:
            self._due[step] = [request]
            heapq.heappush(self._due_steps, step)
        else:
            bucket.append(request)

    def _take_due(self, d: int) -> list[EngineRequest]:
        """The members with an event at decode pass ``d``, in running order."""
        steps = self._due_steps
        while steps and steps[0] < d:  # buckets of members that left
            self._due.pop(heapq.heappop(steps), None)
        if not steps or steps[0] != d:
            return []
        heapq.heappop(steps)
        due = [r for r in self._due.pop(d) if r in self._members]
        due.sort(key=_running_order)
        return due

    def _decode_step(self, batch: list[EngineRequest], start: float, result: PassResult) -> float:
        """One decode step over ``batch`` (in place); returns when its tokens are stamped."""
        self._finish_done(batch, result)
        if not batch:
            return start
        self._retract_for_room(batch, result)
        total = sum(r.length for r in batch)
        decode = self.timing.decode_ms(len(batch), total, total // len(batch))
        if not self._grow(batch, result, self._max_burst):
            return start
        return start + pass_duration(decode, self.timing.decode_divisor)

    def _finish_done(self, batch: list[EngineRequest], result: PassResult) -> list[EngineRequest]:
        """Requests already at their output length finish without a token (out of ``batch``)."""
        done = [r for r in batch if r.generated >= r.max_output]
        if done:
            batch[:] = [r for r in batch if r.generated < r.max_output]
            result.finished += done
        return done

    def _grow(self, batch: list[EngineRequest], result: PassResult, max_burst: int = 1) -> bool:
        """Give each request of ``batch`` its token(s) and their slots; False if pages ran short.

        With ``max_burst`` above 1 (speculative decoding), each request emits a
        sampled burst of up to that many tokens, pages reserved for the largest.
        """
        kv = self.kv
        growth = self._page_growth(batch, max_burst)
        shortfall = growth - kv.available_tokens
        if shortfall > 0:
            kv.evict(shortfall)
        reservation = kv.reserve_decode_pages(growth // self.block_size)
        if reservation is None:
            return False
        finished: list[EngineRequest] = []
        sampler = self._sampler if max_burst > 1 else None
        for request in batch:
            if sampler is None:
                self._decode_token(request, reservation, result, finished)
                continue
            result.bursts = True
            burst = sampler.burst(request.max_output - request.generated)
            if request.generated:  # a decode forward (a first burst comes from the prefill)
                forwards, accepted = result.drafted or (0, 0)
                result.drafted = (forwards + 1, accepted + sampler.accepted)
            for _ in range(burst):
                self._decode_token(request, reservation, result, finished)
                if request.generated >= request.max_output:
                    break
        kv.release_decode_reservation(reservation)
        if finished:
            batch[:] = [r for r in batch if r.generated < r.max_output]
            result.finished += finished
        return True

    def _decode_token(
        self,
        request: EngineRequest,
        reservation: DecodeReservation,
        result: PassResult,
        finished: list[EngineRequest],
    ) -> None:
        """A stepped request's token: its slot (a reserved page at a page start), the
        token, and its completed page cached, or its end."""
        lease = request.lease
        assert lease is not None
        self.kv.extend_decode(lease, reservation)
        request.generated += 1
        request.num_computed += 1
        result.emitted.append(request)
        if request.generated >= request.max_output:
            finished.append(request)
        else:
            self._cache_prefix(request)

    def _page_growth(self, batch: list[EngineRequest], max_burst: int = 1) -> int:
        """Token slots the batch's next tokens (up to ``max_burst`` each) need on new pages."""
        ps = self.block_size
        growth = 0
        for request in batch:
            lease = request.lease
            assert lease is not None
            burst = min(max_burst, request.max_output - request.generated)
            growth += max(0, -(-(request.length + burst) // ps) * ps - len(lease.pages) * ps)
        return growth

    def _retract_for_room(self, batch: list[EngineRequest], result: PassResult) -> None:
        """Retract the fewest-output requests until the batch's next tokens fit (one stays)."""
        kv = self.kv
        while (
            kv.available_tokens + kv.evictable_tokens < self._page_growth(batch, self._max_burst)
            and len(batch) > 1
        ):
            victim = min(batch, key=_output_length)
            batch.remove(victim)
            lease = victim.lease
            assert lease is not None
            kv.retract(lease)
            victim.num_computed = 0
            victim.num_preemptions += 1
            victim.status = Status.PREEMPTED
            self.preemptions_total += 1
            result.preempted.append(victim)
        if result.preempted:
            self._survivors = list(batch)

    def _retraction_ratio(self) -> float:
        """SGLang's re-estimate after a retraction, over the requests that stayed."""
        survivors = self._survivors
        decoded = sum(r.generated for r in survivors) - len(survivors)  # before this step's token
        max_new = sum(r.max_output for r in survivors)
        estimate = (decoded + RETRACT_DECODE_STEPS * len(survivors)) / (max_new + 1)
        return min(1.0, estimate)

    # ----- KV -----

    def _finish(self, request: EngineRequest) -> None:
        request.status = Status.FINISHED
        self.role.finished(request)

    def release_kv(self, request: EngineRequest) -> None:
        """Cache a finished request's page-floored sequence, free the rest and unlock."""
        lease = request.lease
        assert lease is not None
        self._ensure_page_hashes(request, request.num_computed)
        self.kv.finish(lease, request.length)

    def _cache_prefix(self, request: EngineRequest) -> None:
        """Insert the request's newly completed pages into the radix tree (it stays locked)."""
        lease = request.lease
        assert lease is not None
        if self._caching and request.num_computed // self.block_size * self.block_size > (
            lease.cached_tokens
        ):
            self._ensure_page_hashes(request, request.num_computed)
            self.kv.cache_prefix(lease, request.num_computed)

    def _page_hashes(self, request: EngineRequest) -> list[int]:
        """Local hashes of all the complete pages of the request's sequence."""
        return self._ensure_page_hashes(request, request.length)

    def _ensure_page_hashes(self, request: EngineRequest, tokens: int) -> list[int]:
        """Extend the lease's page hashes to the complete pages of the first ``tokens`` tokens.

        Prompt pages hash their tokens, as do pages of output tokens the
        workload knows (``request.sequence``); any other page holding a
        generated token is the request's own (hashed from the request and the
        page index).
        """
        lease = request.lease
        assert lease is not None
        hashes = lease.page_hashes
        ps = self.block_size
        pages = tokens // ps
        if len(hashes) < pages:
            known = request.sequence or request.prompt
            known_pages = known.length // ps
            if len(hashes) < known_pages:
                hashes += known.block_hashes(ps, min(pages, known_pages))[len(hashes) :]
            hashes.extend(generated_block_hash(request.salt, j) for j in range(len(hashes), pages))
        return hashes

    def next_internal_deadline(self) -> float:
        """An SGLang rank has no work of its own (no offload tier)."""
        return math.inf

    def process_internal(self, now: float) -> None:
        """Nothing: see :meth:`next_internal_deadline`."""

    def complete_boundary(self, now: float) -> None:
        """Nothing: see :meth:`next_internal_deadline`."""

    def break_stall(self) -> bool:
        """Nothing to break: an SGLang rank admits no differently at a dead end."""
        return False

    def check(self) -> None:
        """Assert the radix cache's invariants given every lease and reservation of the rank."""
        for member in self._members:
            self._set_progress(member, self._decode_index)
        role = self.role
        requests = [*self.running, *self.waiting, *self.prebuilt]
        if isinstance(role, SourceRole):
            requests += role.held.values()
        leases = [r.lease for r in requests if r.lease is not None]
        self.kv.check(leases, self._reservations.values())

    # ----- the KV operations of its P/D role (servesim.engine.roles.RoleHost) -----

    def destination_slot_free(self) -> bool:
        """SGLang reserves a destination whatever runs: only its pages must fit."""
        return True

    def reserve_prompt(self, request: EngineRequest) -> tuple[int, int] | None:
        """Reserve pages for the prompt, reusing a resident cached prefix; None if they do not fit.

        Returns:
            (reused prompt tokens, transferable tokens = fresh pages x page size).
        """
        if request.lease is None:  # the first try of this reservation
            request.lease = RadixLease()
            self._cap_output(request)
        hashes = self._ensure_page_hashes(request, request.prompt_len)
        reservation = self.kv.reserve_destination(hashes, request.prompt_len)
        if reservation is None:
            return None
        self._reservations[request] = reservation
        return reservation.prefix_len, reservation.transferable_prompt_tokens

    def receive_prompt(self, request: EngineRequest, order: dict[int, int]) -> None:
        """The prompt's KV has arrived: its pages become cached and it waits for a running slot."""
        del order  # SGLang promotes prebuilt requests in activation order
        lease = request.lease
        assert lease is not None
        available = self.kv.available_tokens
        self.kv.activate_destination(self._reservations.pop(request), lease, request.prompt_len)
        request.num_computed = request.prompt_len
        request.status = Status.WAITING
        self.prebuilt.append(request)
        if self.kv.available_tokens > available:
            self.role.capacity_changed()

    def cancel_reservation(self, request: EngineRequest) -> None:
        """Drop a destination reservation that was never activated."""
        self.kv.cancel_destination(self._reservations.pop(request))


def _output_length(request: EngineRequest) -> int:
    return request.generated


def _running_order(request: EngineRequest) -> int:
    return request.seq
