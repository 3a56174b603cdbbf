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
   new_token_ratio``). A prompt larger than what is left of
   ``chunked_prefill_size`` is chunked (whole pages); a chunked request
   returns to the front of ``waiting`` with its complete pages cached.
4. **Time**: the prefill of the admitted chunks (batch size, mean end
   position, mean cached or own prefix), then one decode step. An *extend
   pass* (something was admitted) decodes only the requests whose prefill
   completed in it, emitting their first token; the running requests wait. A
   *decode pass* steps every running request. Every token of the pass is
   stamped at its end.
5. **Decode step**: requests already at their output length finish without a
   token; while free plus evictable KV cannot take one more token per
   request, the request with the fewest output tokens is *retracted* (its
   uncached pages freed; it goes back to the front of ``waiting`` and
   recomputes through the cache) and ``new_token_ratio`` is reset; each
   request then gets one token slot and one token; its completed pages enter
   the radix tree; a finished request caches its page-floored sequence and
   unlocks.
6. ``new_token_ratio`` decays by its step after every pass, down to its floor.

Decode time prices SGLang's *logical* KV: the sum of the batch's sequence
lengths (vLLM prices the physical active blocks). KV events, when recorded,
are published as the radix cache stores and removes pages.
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar

from servesim.config import EngineConfig, Role
from servesim.engine.kv.block_pool import KvEvent
from servesim.engine.kv.hashing import generated_block_hash
from servesim.engine.kv.radix_cache import DestinationReservation, RadixKvManager, RadixLease
from servesim.engine.request import EngineRequest, Status
from servesim.engine.roles import DestinationRole, SourceRole, make_role
from servesim.engine.scheduler import CatchUp, DecodePlan, PassResult
from servesim.engine.timing import TimingModel, pass_duration

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


class SglangScheduler:
    """Waiting, prebuilt and running requests and the radix KV cache of one rank."""

    events_at_pass_end: ClassVar[bool] = True

    def __init__(
        self,
        config: EngineConfig,
        timing: TimingModel,
        *,
        events: list[KvEvent] | None = None,
        lazy: bool = False,
    ) -> None:
        del lazy  # no decode fast-forward: every pass is stepped
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
        self._chunk = sglang.chunked_prefill_size
        self._clip = sglang.clip_max_new_tokens
        self._ratio_init = _NEW_TOKEN_RATIO_INIT * sglang.schedule_conservativeness
        self._ratio_floor = self._ratio_init * _NEW_TOKEN_RATIO_FLOOR
        self._ratio_step = (self._ratio_init - self._ratio_floor) / _NEW_TOKEN_RATIO_DECAY_PASSES
        self.new_token_ratio = self._ratio_init
        # Destination reservations by request, until the transfer activates them.
        self._reservations: dict[EngineRequest, DestinationReservation] = {}
        self.committed_prefill_tokens = 0
        self.preemptions_total = 0
        self.last_emit_ms = 0.0
        self.catch_ups: list[CatchUp] = []
        self._passes = 0
        self._survivors: list[EngineRequest] = []

    # ----- what the worker drives (servesim.engine.scheduler.RankScheduler) -----

    @property
    def kv_events(self) -> list[KvEvent] | None:
        """The KV events recorded since they were last taken (None: not recorded)."""
        return self.kv.events

    @property
    def passes(self) -> int:
        """Passes this rank has run."""
        return self._passes

    def submit(self, request: EngineRequest) -> None:
        """Queue a new request at the back of waiting."""
        request.status = Status.WAITING
        request.lease = RadixLease()
        self.waiting.append(request)

    def has_work(self) -> bool:
        """Whether a pass could do anything."""
        return bool(self.running or self.waiting or self.prebuilt)

    def never_fits(self, request: EngineRequest) -> bool:
        """Whether a fresh request can never be served here: its prompt reaches
        ``max_model_len`` or its page-rounded prompt exceeds the rank's KV."""
        max_len = self.config.max_model_len
        if max_len is not None and request.prompt_len >= max_len:
            return True
        pages = -(-request.prompt_len // self.block_size)
        return pages > self.config.num_gpu_blocks

    def plan_decode(self, limit: int) -> DecodePlan | None:
        """No fast-forward: every SGLang pass is stepped."""
        return None

    def commit_decode(self, plan: DecodePlan, passes: int, end_ms: float) -> list[EngineRequest]:
        """Never called: :meth:`plan_decode` plans nothing."""
        raise AssertionError("an SGLang rank plans no decode windows")

    def take_catch_ups(self) -> list[CatchUp]:
        """Nothing is fast-forwarded, so nothing catches up."""
        return []

    def flush_cohort(self, passes_ended: int, last_ms: float) -> None:
        """Nothing is fast-forwarded, so nothing to flush."""

    def execute_pass(self, now: float) -> PassResult:
        """Decide and apply one pass starting at ``now``; see the module docstring."""
        self._passes += 1
        result = PassResult(end_ms=now)
        self._reject_unservable(result)
        self._promote_prebuilt(result)
        if self._lpm:
            self._lpm_reorder()
        admitted: list[EngineRequest] = []
        sum_isl = sum_prefix = 0
        pending = isinstance(self.role, DestinationRole) and bool(self.role.pending)
        if not self.prebuilt and not pending:
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
            for request in prefilled:
                request.status = Status.RUNNING
            self.running += prefilled
        else:
            result.end_ms = self._decode_step(self.running, start, result)
        for request in result.finished:
            self._finish(request)
        self.waiting += result.preempted  # retracted: to the back, as SGLang re-queues them
        if result.preempted:
            self.new_token_ratio = self._retraction_ratio()
        elif not batch:  # the ratio decays on decode passes
            self.new_token_ratio = max(self.new_token_ratio - self._ratio_step, self._ratio_floor)
        result.progressed = bool(
            result.admitted or result.emitted or result.finished or result.rejected
        ) or bool(result.preempted or admitted)
        return result

    def _reject_unservable(self, result: PassResult) -> None:
        """Drop waiting requests that can never run here (see :meth:`never_fits`)."""
        if any(self.never_fits(r) for r in self.waiting if not r.num_computed):
            keep: deque[EngineRequest] = deque()
            for request in self.waiting:
                if not request.num_computed and self.never_fits(request):
                    request.status = Status.FINISHED
                    result.rejected.append(request)
                else:
                    keep.append(request)
            self.waiting = keep

    # ----- admission -----

    def _promote_prebuilt(self, result: PassResult) -> None:
        prebuilt, running = self.prebuilt, self.running
        while prebuilt and len(running) < self._max_running:
            request = prebuilt.popleft()
            request.status = Status.RUNNING
            running.append(request)
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

    def _admit(self, result: PassResult) -> tuple[list[EngineRequest], int, int]:
        """Admit prefill chunks from waiting; returns (requests, sum of chunk ends, sum of prefixes)."""
        ps, kv, clip, ratio = self.block_size, self.kv, self._clip, self.new_token_ratio
        reserved = 0.0
        for request in self.running:
            reserved += min(request.max_output - request.generated, clip) * ratio
        rem_total = (kv.available_tokens + kv.evictable_tokens) - reserved
        rem_input = float(self._max_prefill)
        rem_chunk = float(self._chunk)
        slots = self._max_running - len(self.running)
        waiting = self.waiting
        admitted: list[EngineRequest] = []
        sum_isl = sum_prefix = 0
        while len(admitted) < slots and waiting:
            request = waiting.popleft()
            lease = request.lease
            assert lease is not None
            materialized = request.num_computed
            length = request.length
            cached = 0
            if not materialized and self._caching:
                # The last token is always computed (its logits are needed).
                hashes = self._page_hashes(request)
                match_len = length if request.max_output == 0 else length - 1
                cached = kv.prefix_match_len(hashes, match_len // ps)
            start = max(materialized, cached)
            extend = length - start
            if extend == 0 and materialized:
                waiting.appendleft(request)
                break
            if -(-extend // ps) * ps <= rem_chunk:
                chunk = extend
            else:
                chunk = min(int(rem_chunk) // ps * ps, extend)
                if chunk == 0:
                    waiting.appendleft(request)
                    break
            charged = -(-chunk // ps) * ps
            reserve = 0 if chunk < extend else min(request.max_output - request.generated, clip)
            if charged + reserve >= rem_total or charged > rem_input or charged > rem_chunk:
                waiting.appendleft(request)
                break
            end = start + chunk
            self._ensure_page_hashes(request, end)
            if materialized:
                prefix = kv.extend(lease, end)
            else:
                prefix = kv.allocate(lease, end, match_limit=start)
            if prefix is None:
                waiting.appendleft(request)
                break
            request.num_computed = end
            if not materialized:
                result.admitted.append((request, prefix))
            self.committed_prefill_tokens += end - prefix
            admitted.append(request)
            sum_isl += end
            sum_prefix += prefix
            rem_total -= charged + reserve
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
            self._grow(batch, result)
        return start

    def _decode_step(self, batch: list[EngineRequest], start: float, result: PassResult) -> float:
        """One decode step over ``batch`` (in place); returns when its tokens are stamped."""
        self._finish_done(batch, result)
        if not batch:
            return start
        self._retract_for_room(batch, result)
        total = sum(r.length for r in batch)
        decode = self.timing.decode_ms(len(batch), total, total // len(batch))
        if not self._grow(batch, result):
            return start
        return start + pass_duration(decode / self.timing.decode_divisor)

    def _finish_done(self, batch: list[EngineRequest], result: PassResult) -> None:
        """Requests already at their output length finish without a token."""
        done = [r for r in batch if r.generated >= r.max_output]
        if done:
            batch[:] = [r for r in batch if r.generated < r.max_output]
            result.finished += done

    def _grow(self, batch: list[EngineRequest], result: PassResult) -> bool:
        """Give each request of ``batch`` a token slot and a token; False if pages ran short."""
        kv = self.kv
        growth = self._page_growth(batch)
        shortfall = growth - kv.available_tokens
        if shortfall > 0:
            kv.evict(shortfall)
        reservation = kv.reserve_decode_pages(growth // self.block_size)
        if reservation is None:
            return False
        finished = []
        for request in batch:
            lease = request.lease
            assert lease is not None
            kv.extend_decode(lease, reservation)
            request.generated += 1
            request.num_computed += 1
            result.emitted.append(request)
            if request.generated >= request.max_output:
                finished.append(request)
            else:
                self._cache_prefix(request)
        kv.release_decode_reservation(reservation)
        if finished:
            batch[:] = [r for r in batch if r.generated < r.max_output]
            result.finished += finished
        return True

    def _page_growth(self, batch: list[EngineRequest]) -> int:
        """Token slots the batch's next token needs on new pages."""
        ps = self.block_size
        growth = 0
        for request in batch:
            lease = request.lease
            assert lease is not None
            growth += max(0, -(-(request.length + 1) // ps) * ps - len(lease.pages) * ps)
        return growth

    def _retract_for_room(self, batch: list[EngineRequest], result: PassResult) -> None:
        """Retract the fewest-output requests until the batch's next tokens fit (one stays)."""
        kv = self.kv
        while (
            kv.available_tokens + kv.evictable_tokens < self._page_growth(batch) and len(batch) > 1
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

        Prompt pages hash their tokens; a page holding any generated token is
        the request's own (hashed from the request and the page index).
        """
        lease = request.lease
        assert lease is not None
        hashes = lease.page_hashes
        ps = self.block_size
        pages = tokens // ps
        if len(hashes) < pages:
            prompt_pages = request.prompt_len // ps
            if len(hashes) < prompt_pages:
                hashes += request.prompt.block_hashes(ps, min(pages, prompt_pages))[len(hashes) :]
            hashes.extend(generated_block_hash(request.salt, j) for j in range(len(hashes), pages))
        return hashes

    def check(self) -> None:
        """Assert the radix cache's invariants given every lease and reservation of the rank."""
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
        request.lease = RadixLease()
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
