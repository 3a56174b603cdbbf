"""The P/D handoff coordinator: narrative runs with exact action ids, then invariants.

Narratives drive one coordinator step by step and compare the returned actions
with ``==`` (actions are frozen dataclasses, so the ids and delays are exact). The
Hypothesis tests drive it with a small simulated runtime that answers every
action validly, sometimes fails, cancels or times out, and checks exactly-once
completion and that no KV is left held on either side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.cluster.handoff import (
    NORMALIZED_LIFECYCLE,
    Action,
    ActivateDestination,
    CancelDestination,
    Canceled,
    CancelSource,
    Complete,
    Completion,
    DestinationReserved,
    Fact,
    Failed,
    HandoffCoordinator,
    HandoffError,
    HandoffOrder,
    HandoffPhase,
    LifecycleEvent,
    Outcome,
    ReleaseSource,
    ReserveDestination,
    SourceHeld,
    StartTransfer,
    SubmitPrefill,
    TimedOut,
    TransferCompleted,
    TransferMode,
    TransferTiming,
)
from servesim.errors import SimulationError

SF = HandoffOrder.SOURCE_FIRST
DF = HandoffOrder.DESTINATION_FIRST
P = HandoffPhase

# 1000 tokens × 128 KiB at 10 GB/s.
TIMING = TransferTiming(full_prompt_tokens=1000, kv_bytes_per_token=131072, bandwidth_gb_s=10.0)
TIMING_MS = 13.107199999999999  # TIMING's delay, as the reference rounds 13.1072 ms
NO_BANDWIDTH = TransferTiming(
    full_prompt_tokens=1000, kv_bytes_per_token=131072, bandwidth_gb_s=None
)


def make_coordinator(order: HandoffOrder, latency_ms: float = 0.0) -> HandoffCoordinator:
    return HandoffCoordinator(order, handoff_latency_ms=latency_ms)


def phase(c: HandoffCoordinator) -> HandoffPhase:
    """The coordinator's phase, read afresh.

    (``assert c.phase is X`` would let the type checker narrow ``c.phase`` to X
    for the rest of the test, though every call on ``c`` may change it.)
    """
    return c.phase


def source_first_until_transfer(
    timing: TransferTiming = TIMING, tokens: int = 1000, latency_ms: float = 0.0
) -> tuple[HandoffCoordinator, list[Action]]:
    """A SOURCE_FIRST coordinator driven up to its StartTransfer (id 2), unanswered."""
    c = make_coordinator(SF, latency_ms)
    assert c.start() == [SubmitPrefill(id=0)]
    assert c.on_outcome(0, Outcome.SUBMITTED) == []
    assert c.on_fact(SourceHeld(timing=timing)) == [ReserveDestination(id=1)]
    assert c.on_outcome(1, Outcome.ACCEPTED) == []
    return c, c.on_fact(DestinationReserved(transferable_prompt_tokens=tokens))


def finish_transfer(c: HandoffCoordinator, transfer_id: int) -> None:
    """Schedule and complete the transfer, activate, release: Complete(SUCCESS) follows."""
    n = transfer_id
    assert c.on_outcome(n, Outcome.SCHEDULED) == []
    assert phase(c) is P.TRANSFER_PENDING
    assert c.on_fact(TransferCompleted()) == [ActivateDestination(id=n + 1)]
    assert c.on_outcome(n + 1, Outcome.APPLIED) == [ReleaseSource(id=n + 2)]
    assert phase(c) is P.READY_DECODE
    assert c.on_outcome(n + 2, Outcome.APPLIED) == [
        Complete(id=n + 3, completion=Completion.SUCCESS)
    ]


# ------------------------------------------------------------------ transfer timing


def test_transfer_delay_examples_from_the_spec() -> None:
    """128 tokens × 1000 B at 1 GB/s is 0.128 ms; 1000 × 131072 B at 10 GB/s is 13.1072 ms."""
    small = TransferTiming(full_prompt_tokens=128, kv_bytes_per_token=1000, bandwidth_gb_s=1.0)
    assert small.delay_ms(0) == 0.128
    # FULL_PROMPT ignores the destination's count; the float is the reference's (seconds,
    # then ms), one step below 13.1072.
    assert TIMING.delay_ms(7) == TIMING_MS


@pytest.mark.parametrize(
    ("tokens", "bandwidth", "held_ms", "activated_ms"),
    [
        # The reference's source_held_ms and destination_activated_ms, one request of
        # ``tokens`` tokens at 131,072 B each on an idle independent link.
        (32, 1.0, 16.987721, 21.182025000000003),
        (29, 3.0, 16.942094, 18.209123333333334),
        (1000, 10.0, 32.105859, 45.213059),
    ],
)
def test_transfer_delay_rounds_as_the_reference(
    tokens: int, bandwidth: float, held_ms: float, activated_ms: float
) -> None:
    """The transfer ends at the reference's float to the last bit (bytes / (GB/s x 1e6)
    gives 21.182025 for the first: a tie with another transfer's end would then break
    the other way)."""
    timing = TransferTiming(
        full_prompt_tokens=tokens, kv_bytes_per_token=131_072, bandwidth_gb_s=bandwidth
    )
    delay = timing.delay_ms(0)
    assert delay is not None
    assert held_ms + delay == activated_ms


def test_destination_missing_mode_prices_the_missing_tokens_plus_per_request_bytes() -> None:
    """DESTINATION_MISSING prices only the missing tokens; per-request bytes always count."""
    timing = TransferTiming(
        mode=TransferMode.DESTINATION_MISSING,
        full_prompt_tokens=1000,
        kv_bytes_per_token=1000,
        kv_bytes_per_request=2_000_000,
        bandwidth_gb_s=1.0,
    )
    assert timing.delay_ms(128) == 2.128
    assert timing.delay_ms(0) == 2.0


@pytest.mark.parametrize(
    ("per_token", "per_request", "bandwidth"),
    [
        (1000.0, 0.0, None),
        (1000.0, 0.0, 0.0),
        (1000.0, 0.0, -1.0),
        (1000.0, 0.0, math.inf),
        (1000.0, 0.0, math.nan),
        (None, 0.0, 1.0),
    ],
)
def test_unpriceable_transfers_have_no_delay(
    per_token: float | None, per_request: float, bandwidth: float | None
) -> None:
    """No usable bandwidth, or no KV size at all, gives None (the coordinator falls back)."""
    timing = TransferTiming(
        full_prompt_tokens=10,
        kv_bytes_per_token=per_token,
        kv_bytes_per_request=per_request,
        bandwidth_gb_s=bandwidth,
    )
    assert timing.delay_ms(10) is None


def test_per_request_bytes_alone_price_a_transfer() -> None:
    """Without a per-token size, the per-request bytes still give a delay."""
    timing = TransferTiming(
        full_prompt_tokens=10, kv_bytes_per_token=None, kv_bytes_per_request=1e6, bandwidth_gb_s=1.0
    )
    assert timing.delay_ms(0) == 1.0


def test_transfer_timing_rejects_negative_sizes() -> None:
    """Negative token counts and byte sizes are misuse."""
    with pytest.raises(ValueError, match="full_prompt_tokens -1"):
        TransferTiming(full_prompt_tokens=-1, kv_bytes_per_token=1.0, bandwidth_gb_s=1.0)
    with pytest.raises(ValueError, match="kv_bytes_per_request"):
        TransferTiming(
            full_prompt_tokens=1, kv_bytes_per_token=1.0, kv_bytes_per_request=-2, bandwidth_gb_s=1
        )
    with pytest.raises(ValueError, match="destination_missing_tokens -3"):
        TIMING.delay_ms(-3)
    with pytest.raises(ValueError, match="transferable_prompt_tokens"):
        DestinationReserved(transferable_prompt_tokens=-1)


# ----------------------------------------------------------------- happy paths


def test_source_first_happy_path() -> None:
    """Prefill, reserve, transfer at 13.1072 ms, activate, release, complete; then decode."""
    c = make_coordinator(SF)
    assert phase(c) is P.QUEUED_PREFILL and not c.is_active
    assert c.start() == [SubmitPrefill(id=0)]
    assert c.is_active and phase(c) is P.QUEUED_PREFILL
    assert c.on_outcome(0, Outcome.SUBMITTED) == []
    assert phase(c) is P.RUNNING_PREFILL
    assert c.on_fact(SourceHeld(timing=TIMING)) == [ReserveDestination(id=1)]
    assert phase(c) is P.AWAITING_DESTINATION
    assert c.on_outcome(1, Outcome.ACCEPTED) == []
    assert c.on_fact(DestinationReserved(transferable_prompt_tokens=1000)) == [
        StartTransfer(id=2, delay_ms=TIMING_MS)
    ]
    finish_transfer(c, 2)
    assert c.is_complete and not c.is_active and c.completion is Completion.SUCCESS
    assert phase(c) is P.READY_DECODE  # the decode side still has the request
    c.decode_admitted()
    assert phase(c) is P.RUNNING_DECODE
    c.decode_finished()
    assert phase(c) is P.DONE
    assert c.lifecycle == NORMALIZED_LIFECYCLE[SF]
    assert c.cleanup_reason is None


def test_source_first_without_bandwidth_uses_the_handoff_latency() -> None:
    """A timing that cannot price the transfer falls back to handoff_latency_ms."""
    c, actions = source_first_until_transfer(NO_BANDWIDTH, latency_ms=2.5)
    assert actions == [StartTransfer(id=2, delay_ms=2.5)]
    finish_transfer(c, 2)


def test_default_handoff_latency_is_zero() -> None:
    """With neither bandwidth nor a latency the transfer is instantaneous."""
    _, actions = source_first_until_transfer(NO_BANDWIDTH)
    assert actions == [StartTransfer(id=2, delay_ms=0.0)]


def test_destination_first_happy_path() -> None:
    """Reserve first, then prefill; the rest is the common tail."""
    c = make_coordinator(DF)
    assert phase(c) is P.AWAITING_DESTINATION
    assert c.start() == [ReserveDestination(id=0)]
    assert c.on_outcome(0, Outcome.ACCEPTED) == []
    assert phase(c) is P.AWAITING_DESTINATION
    assert c.on_fact(DestinationReserved(transferable_prompt_tokens=1000)) == [SubmitPrefill(id=1)]
    assert phase(c) is P.QUEUED_PREFILL
    assert c.on_outcome(1, Outcome.SUBMITTED) == []
    assert phase(c) is P.RUNNING_PREFILL
    assert c.on_fact(SourceHeld(timing=TIMING)) == [StartTransfer(id=2, delay_ms=TIMING_MS)]
    finish_transfer(c, 2)
    c.decode_admitted()
    c.decode_finished()
    assert phase(c) is P.DONE
    assert c.lifecycle == NORMALIZED_LIFECYCLE[DF]


@pytest.mark.parametrize(
    ("tokens", "per_request", "delay"),
    [(128, 0.0, 0.128), (0, 0.0, 0.0), (0, 4e6, 4.0), (128, 4e6, 4.128)],
)
def test_destination_missing_mode_prices_the_reserved_tokens(
    tokens: int, per_request: float, delay: float
) -> None:
    """The reserved (missing) token count prices the transfer; 0 leaves the per-request bytes."""
    timing = TransferTiming(
        mode=TransferMode.DESTINATION_MISSING,
        full_prompt_tokens=5000,
        kv_bytes_per_token=1000,
        kv_bytes_per_request=per_request,
        bandwidth_gb_s=1.0,
    )
    c, actions = source_first_until_transfer(timing, tokens=tokens, latency_ms=99.0)
    assert actions == [StartTransfer(id=2, delay_ms=delay)]
    finish_transfer(c, 2)


def test_decode_may_finish_before_the_source_is_released() -> None:
    """Decode ends while the release is outstanding: CLEANUP_PENDING, then DONE at Complete."""
    c, _ = source_first_until_transfer()
    c.on_outcome(2, Outcome.SCHEDULED)
    c.on_fact(TransferCompleted())
    assert c.on_outcome(3, Outcome.APPLIED) == [ReleaseSource(id=4)]
    c.decode_admitted()
    c.decode_finished()
    assert phase(c) is P.CLEANUP_PENDING and c.is_active
    assert c.on_outcome(4, Outcome.NOOP) == [Complete(id=5, completion=Completion.SUCCESS)]
    assert phase(c) is P.DONE


# ------------------------------------------------------------------ cleanup paths


def test_failure_during_prefill_cancels_only_the_source() -> None:
    """Failed after SUBMITTED: CancelSource alone, then Complete(CANCELED) after its outcome."""
    c = make_coordinator(SF)
    c.start()
    c.on_outcome(0, Outcome.SUBMITTED)
    assert c.on_fact(Failed(reason="prefill rejected")) == [CancelSource(id=1)]
    assert not c.is_active and not c.is_complete
    assert phase(c) is P.CLEANUP_PENDING
    assert c.cleanup_reason == "prefill rejected"
    assert c.on_outcome(1, Outcome.APPLIED) == [Complete(id=2, completion=Completion.CANCELED)]
    assert c.is_complete and c.completion is Completion.CANCELED
    assert phase(c) is P.DONE
    assert c.lifecycle == (LifecycleEvent.SOURCE_CANCELED, LifecycleEvent.CANCELED)


def test_cancel_after_both_sides_exist_cancels_both_at_once() -> None:
    """Canceled during the transfer issues both cancels in one batch; Complete waits for both."""
    c, _ = source_first_until_transfer()
    assert c.on_outcome(2, Outcome.SCHEDULED) == []
    assert c.on_fact(Canceled()) == [CancelSource(id=3), CancelDestination(id=4)]
    assert c.on_outcome(4, Outcome.APPLIED) == []
    assert c.on_outcome(3, Outcome.NOOP) == [Complete(id=5, completion=Completion.CANCELED)]
    assert phase(c) is P.DONE
    assert c.cleanup_reason == "canceled"


def test_failed_reserve_destination_outcome_starts_cleanup() -> None:
    """A FAILED reserve cancels the held source and the (unrouted) destination."""
    c = make_coordinator(SF)
    c.start()
    c.on_outcome(0, Outcome.SUBMITTED)
    c.on_fact(SourceHeld(timing=TIMING))
    assert c.on_outcome(1, Outcome.FAILED, message="no decode capacity") == [
        CancelSource(id=2),
        CancelDestination(id=3),
    ]
    assert c.cleanup_reason == "ReserveDestination failed: no decode capacity"
    assert c.on_outcome(3, Outcome.NOOP) == []
    assert c.on_outcome(2, Outcome.APPLIED) == [Complete(id=4, completion=Completion.CANCELED)]


def test_destination_first_timeout_before_prefill_cancels_only_the_destination() -> None:
    """Nothing was submitted yet, so only the destination is canceled."""
    c = make_coordinator(DF)
    c.start()
    assert c.on_fact(TimedOut()) == [CancelDestination(id=1)]
    assert c.cleanup_reason == "timed out"
    assert c.on_outcome(1, Outcome.NOOP) == [Complete(id=2, completion=Completion.CANCELED)]


def test_failed_activation_cancels_both_sides() -> None:
    """A FAILED activation is a failure of a non-cancel action: cleanup."""
    c, _ = source_first_until_transfer()
    c.on_outcome(2, Outcome.SCHEDULED)
    assert c.on_fact(TransferCompleted()) == [ActivateDestination(id=3)]
    assert c.on_outcome(3, Outcome.FAILED) == [CancelSource(id=4), CancelDestination(id=5)]


def test_decode_finished_spares_the_destination_from_cleanup() -> None:
    """A failed release after decode finished cancels only the source."""
    c, _ = source_first_until_transfer()
    finish_transfer_until_release(c)
    c.decode_admitted()
    c.decode_finished()
    assert c.on_outcome(4, Outcome.FAILED, message="busy") == [CancelSource(id=5)]
    assert c.on_outcome(5, Outcome.APPLIED) == [Complete(id=6, completion=Completion.CANCELED)]
    assert phase(c) is P.DONE


def finish_transfer_until_release(c: HandoffCoordinator) -> None:
    """From an issued StartTransfer (id 2) to an issued, unanswered ReleaseSource (id 4)."""
    c.on_outcome(2, Outcome.SCHEDULED)
    c.on_fact(TransferCompleted())
    assert c.on_outcome(3, Outcome.APPLIED) == [ReleaseSource(id=4)]


def test_cancel_while_the_release_is_outstanding_completes_on_the_first_cleanup() -> None:
    """Canceled while the release is pending: whichever frees the source first counts."""
    c, _ = source_first_until_transfer()
    finish_transfer_until_release(c)
    assert c.on_fact(Canceled()) == [CancelSource(id=5), CancelDestination(id=6)]
    assert c.on_outcome(6, Outcome.APPLIED) == []
    assert c.on_outcome(4, Outcome.APPLIED) == [Complete(id=7, completion=Completion.CANCELED)]
    assert c.on_outcome(5, Outcome.NOOP) == []
    assert c.lifecycle[-3:] == (
        LifecycleEvent.DESTINATION_CANCELED,
        LifecycleEvent.SOURCE_RELEASED,
        LifecycleEvent.CANCELED,
    )


def test_outcomes_of_earlier_actions_are_recorded_during_cleanup() -> None:
    """A submit answered after the cancel started changes neither phase nor plan."""
    c = make_coordinator(SF)
    c.start()
    assert c.on_fact(Canceled()) == [CancelSource(id=1)]
    assert c.on_outcome(0, Outcome.SUBMITTED) == []
    assert phase(c) is P.CLEANUP_PENDING
    assert c.on_outcome(1, Outcome.APPLIED) == [Complete(id=2, completion=Completion.CANCELED)]
    assert c.on_outcome(0, Outcome.SUBMITTED) == []  # a repeat, after Complete


def test_facts_after_active_mode_are_ignored() -> None:
    """Once cleanup starts, facts (even ones that would break a guard) are ignored."""
    c = make_coordinator(SF)
    c.start()
    c.on_fact(Canceled())
    assert c.on_fact(TransferCompleted()) == []
    assert c.on_fact(Failed(reason="late")) == []
    assert c.cleanup_reason == "canceled"
    c.on_outcome(1, Outcome.NOOP)
    assert c.on_fact(SourceHeld(timing=TIMING)) == []
    assert c.on_fact(TimedOut()) == []


def test_facts_after_success_are_ignored() -> None:
    """A cancel after Complete(SUCCESS) is the decode side's business, not the handoff's."""
    c, _ = source_first_until_transfer()
    finish_transfer(c, 2)
    assert c.on_fact(Canceled()) == []
    assert c.completion is Completion.SUCCESS and c.cleanup_reason is None


# ------------------------------------------------------------------ misuse


def test_guards_reject_facts_that_come_too_early() -> None:
    """SourceHeld before SUBMITTED, DestinationReserved before ACCEPTED, TransferCompleted before SCHEDULED."""
    c = make_coordinator(SF)
    c.start()
    with pytest.raises(HandoffError, match="before SubmitPrefill was SUBMITTED"):
        c.on_fact(SourceHeld(timing=TIMING))
    c.on_outcome(0, Outcome.SUBMITTED)
    c.on_fact(SourceHeld(timing=TIMING))
    with pytest.raises(HandoffError, match="before ReserveDestination was ACCEPTED"):
        c.on_fact(DestinationReserved(transferable_prompt_tokens=1))
    c.on_outcome(1, Outcome.ACCEPTED)
    c.on_fact(DestinationReserved(transferable_prompt_tokens=1))
    with pytest.raises(HandoffError, match="before StartTransfer was SCHEDULED"):
        c.on_fact(TransferCompleted())


def test_destination_first_guards_source_held_before_submit_is_issued() -> None:
    """In DESTINATION_FIRST a SourceHeld before any submit is a guard violation."""
    c = make_coordinator(DF)
    c.start()
    with pytest.raises(HandoffError, match="SubmitPrefill"):
        c.on_fact(SourceHeld(timing=TIMING))


def test_handoff_error_is_a_simulation_error() -> None:
    """Protocol violations report like every other broken simulation."""
    assert issubclass(HandoffError, SimulationError)


def test_inputs_before_start_and_a_second_start_raise() -> None:
    """start() comes first and only once; outcomes need an issued action."""
    c = make_coordinator(SF)
    with pytest.raises(HandoffError, match="before start"):
        c.on_fact(Canceled())
    with pytest.raises(HandoffError, match="unknown action id 0"):
        c.on_outcome(0, Outcome.SUBMITTED)
    c.start()
    with pytest.raises(HandoffError, match="already started"):
        c.start()
    with pytest.raises(HandoffError, match="unknown action id 7"):
        c.on_outcome(7, Outcome.SUBMITTED)


def test_duplicate_outcomes_are_ignored_and_conflicting_ones_raise() -> None:
    """The same outcome twice is a no-op; a different one is an error."""
    c = make_coordinator(SF)
    c.start()
    assert c.on_outcome(0, Outcome.SUBMITTED) == []
    assert c.on_outcome(0, Outcome.SUBMITTED) == []
    with pytest.raises(HandoffError, match="FAILED after SUBMITTED"):
        c.on_outcome(0, Outcome.FAILED)
    assert c.is_active


def test_duplicate_facts_are_ignored() -> None:
    """A second SourceHeld issues nothing and is not recorded again."""
    c = make_coordinator(SF)
    c.start()
    c.on_outcome(0, Outcome.SUBMITTED)
    assert c.on_fact(SourceHeld(timing=TIMING)) == [ReserveDestination(id=1)]
    assert c.on_fact(SourceHeld(timing=NO_BANDWIDTH)) == []
    c.on_outcome(1, Outcome.ACCEPTED)
    assert c.on_fact(DestinationReserved(transferable_prompt_tokens=3)) == [
        StartTransfer(id=2, delay_ms=TIMING_MS)
    ]
    assert c.on_fact(DestinationReserved(transferable_prompt_tokens=3)) == []
    c.on_outcome(2, Outcome.SCHEDULED)
    assert c.on_fact(TransferCompleted()) == [ActivateDestination(id=3)]
    assert c.on_fact(TransferCompleted()) == []
    assert c.lifecycle == NORMALIZED_LIFECYCLE[SF][:3]


def test_outcomes_an_action_cannot_have_raise() -> None:
    """Each action accepts only its required outcomes (or FAILED for non-cancels)."""
    c = make_coordinator(SF)
    c.start()
    with pytest.raises(HandoffError, match="cannot have outcome APPLIED"):
        c.on_outcome(0, Outcome.APPLIED)
    with pytest.raises(ValueError, match="message 'why' given with outcome SUBMITTED"):
        c.on_outcome(0, Outcome.SUBMITTED, message="why")
    assert c.on_fact(Canceled()) == [CancelSource(id=1)]
    with pytest.raises(HandoffError, match="cannot have outcome SCHEDULED"):
        c.on_outcome(1, Outcome.SCHEDULED)
    assert c.on_outcome(1, Outcome.NOOP) == [Complete(id=2, completion=Completion.CANCELED)]
    with pytest.raises(HandoffError, match="cannot have outcome APPLIED"):
        c.on_outcome(2, Outcome.APPLIED)


def test_a_failed_cancel_is_a_hard_error() -> None:
    """Nothing can clean up after a cancel that failed."""
    c = make_coordinator(DF)
    c.start()
    c.on_fact(Canceled())
    with pytest.raises(HandoffError, match="a failed cancel cannot be cleaned up"):
        c.on_outcome(1, Outcome.FAILED, message="engine error")


def test_negative_handoff_latency_is_rejected() -> None:
    """The fallback delay must be a finite, non-negative time."""
    with pytest.raises(ValueError, match="handoff_latency_ms"):
        HandoffCoordinator(SF, handoff_latency_ms=-1.0)
    with pytest.raises(ValueError, match="handoff_latency_ms"):
        HandoffCoordinator(SF, handoff_latency_ms=math.nan)


# ------------------------------------------------------------------ decode phases


def test_decode_admitted_from_the_wrong_phase_raises() -> None:
    """Admission is valid only in READY_DECODE."""
    c = make_coordinator(SF)
    c.start()
    with pytest.raises(HandoffError, match="QUEUED_PREFILL -> RUNNING_DECODE needs READY_DECODE"):
        c.decode_admitted()
    c, _ = source_first_until_transfer()
    c.on_outcome(2, Outcome.SCHEDULED)
    with pytest.raises(HandoffError, match="TRANSFER_PENDING -> RUNNING_DECODE"):
        c.decode_admitted()


def test_decode_finished_twice_or_too_early_raises() -> None:
    """Decode can finish once, and only after activation."""
    c, _ = source_first_until_transfer()
    with pytest.raises(HandoffError, match="AWAITING_DESTINATION -> CLEANUP_PENDING"):
        c.decode_finished()
    finish_transfer(c, 2)
    c.decode_admitted()
    with pytest.raises(HandoffError, match="RUNNING_DECODE -> RUNNING_DECODE"):
        c.decode_admitted()
    c.decode_finished()
    with pytest.raises(HandoffError, match="DONE -> CLEANUP_PENDING"):
        c.decode_finished()


def test_rejected_before_admission_finishes_from_ready_decode() -> None:
    """A decode rejection may end the request without an admission."""
    c, _ = source_first_until_transfer()
    finish_transfer(c, 2)
    c.decode_finished()
    assert phase(c) is P.DONE


def test_decode_reports_after_a_cancel_are_ignored() -> None:
    """A pass in flight may still admit or finish a request being canceled."""
    c, _ = source_first_until_transfer()
    finish_transfer_until_release(c)
    assert c.on_fact(Canceled()) == [CancelSource(id=5), CancelDestination(id=6)]
    c.decode_admitted()
    c.decode_finished()
    assert phase(c) is P.CLEANUP_PENDING
    c.on_outcome(5, Outcome.APPLIED)
    assert c.on_outcome(6, Outcome.NOOP) == [Complete(id=7, completion=Completion.CANCELED)]
    c.decode_finished()
    assert phase(c) is P.DONE


# ------------------------------------------------------------------ invariants

PHASE_ORDER = {
    SF: [
        P.QUEUED_PREFILL,
        P.RUNNING_PREFILL,
        P.AWAITING_DESTINATION,
        P.TRANSFER_PENDING,
        P.READY_DECODE,
        P.RUNNING_DECODE,
        P.CLEANUP_PENDING,
        P.DONE,
    ],
    DF: [
        P.AWAITING_DESTINATION,
        P.QUEUED_PREFILL,
        P.RUNNING_PREFILL,
        P.TRANSFER_PENDING,
        P.READY_DECODE,
        P.RUNNING_DECODE,
        P.CLEANUP_PENDING,
        P.DONE,
    ],
}

FAILABLE = (SubmitPrefill, ReserveDestination, ActivateDestination, ReleaseSource)
MAX_NOISE = 3
NOISE_ODDS = 8
FAIL_ODDS = 6
LATENCY_MS = 1.5

timings = st.builds(
    TransferTiming,
    mode=st.sampled_from(TransferMode),
    full_prompt_tokens=st.integers(0, 4096),
    kv_bytes_per_token=st.one_of(st.none(), st.floats(0, 1e6)),
    kv_bytes_per_request=st.floats(0, 1e7),
    bandwidth_gb_s=st.one_of(
        st.none(), st.floats(0.01, 100), st.sampled_from([0.0, -1.0, math.inf, math.nan])
    ),
)


@dataclass
class SimulatedRuntime:
    """A small valid runtime around one coordinator.

    It answers each pending action with an outcome its engines could give,
    emits facts only once their guard holds, and runs the decode side once the
    destination is activated. Canceling a side drops that side's unanswered
    actions and facts, as canceling a parked route does. It tracks whether the
    source and destination hold KV, so the test can check nothing leaks.
    """

    coordinator: HandoffCoordinator
    data: st.DataObject
    timing: TransferTiming
    tokens: int
    issued: list[Action] = field(default_factory=list)
    pending: list[Action] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    seen_facts: list[Fact] = field(default_factory=list)
    answered: dict[int, Outcome] = field(default_factory=dict)
    phases: list[HandoffPhase] = field(default_factory=list)
    source_kv: bool = False
    destination_kv: bool = False
    activated: bool = False
    admitted: bool = False
    decode_done: bool = False
    noise: int = 0

    def take(self, actions: list[Action]) -> None:
        """Check and queue what the coordinator issued."""
        if any(isinstance(a, Complete) for a in self.issued):
            assert actions == [], "an action was issued after Complete"
        for action in actions:
            assert action.id == len(self.issued), "ids are issued in order"
            self.issued.append(action)
            if isinstance(action, Complete):
                assert action is actions[-1]
                assert not self.source_kv, "Complete while the source holds KV"
            else:
                self.pending.append(action)

    def moves(self) -> list[tuple[str, object]]:
        """Every step a runtime could take now (answer, report a fact, run decode)."""
        moves: list[tuple[str, object]] = [("answer", a) for a in self.pending]
        moves += [("fact", f) for f in self.facts]
        if self.activated and not self.admitted and not self.decode_done:
            moves.append(("admit", None))
        if self.activated and not self.decode_done:
            moves.append(("finish", None))  # without admission: a decode rejection
        return moves

    def noise_moves(self) -> list[tuple[str, object]]:
        """Cancels, time-outs, failures and repeated inputs, at most MAX_NOISE in a run."""
        if self.noise >= MAX_NOISE:
            return []
        moves: list[tuple[str, object]] = [
            ("noise", f) for f in (Canceled(), TimedOut(), Failed(reason="x"))
        ]
        moves += [("repeat", f) for f in self.seen_facts]
        moves += [("repeat", (i, o)) for i, o in self.answered.items()]
        return moves

    def step(self, kind: str, payload: object) -> None:
        """Take one move returned by :meth:`moves` or :meth:`noise_moves`."""
        c = self.coordinator
        if kind == "answer":
            assert isinstance(payload, Action)
            self.answer(payload)
        elif kind == "fact":
            assert isinstance(payload, Fact)
            self.facts.remove(payload)
            self.seen_facts.append(payload)
            self.take(c.on_fact(payload))
        elif kind == "admit":
            self.admitted = True
            c.decode_admitted()
        elif kind == "finish":
            self.decode_done, self.destination_kv = True, False
            c.decode_finished()
        elif kind == "noise":
            assert isinstance(payload, Fact)
            self.noise += 1
            self.take(c.on_fact(payload))
        else:
            self.noise += 1
            self.repeat(payload)

    def repeat(self, payload: object) -> None:
        """Send an input again, unchanged: it must issue nothing."""
        if isinstance(payload, tuple):
            action_id, outcome = payload
            assert self.coordinator.on_outcome(action_id, outcome) == []
        else:
            assert isinstance(payload, Fact)
            assert self.coordinator.on_fact(payload) == []

    def answer(self, action: Action) -> None:
        """Execute a pending action and report its outcome."""
        self.pending.remove(action)
        outcome = self.outcome_for(action)
        self.answered[action.id] = outcome
        self.take(self.coordinator.on_outcome(action.id, outcome))

    def fails(self, action: Action) -> bool:
        """Fail a failable action about one time in FAIL_ODDS; shrinking removes failures."""
        return (
            isinstance(action, FAILABLE)
            and self.data.draw(st.integers(0, FAIL_ODDS - 1)) == FAIL_ODDS - 1
        )

    def outcome_for(self, action: Action) -> Outcome:
        """Apply ``action`` to the simulated engines and say how it went."""
        if self.fails(action):
            return Outcome.FAILED
        match action:
            case SubmitPrefill():
                self.source_kv = True
                self.facts.append(SourceHeld(timing=self.timing))
                return Outcome.SUBMITTED
            case ReserveDestination():
                self.destination_kv = True
                self.facts.append(DestinationReserved(transferable_prompt_tokens=self.tokens))
                return Outcome.ACCEPTED
            case StartTransfer(delay_ms=delay):
                priced = self.timing.delay_ms(self.tokens)
                assert delay == (LATENCY_MS if priced is None else priced)
                assert math.isfinite(delay) and delay >= 0
                self.facts.append(TransferCompleted())
                return Outcome.SCHEDULED
            case ActivateDestination():
                self.activated = True
                return Outcome.APPLIED
            case ReleaseSource() | CancelSource():
                return self.free_source()
            case CancelDestination():
                return self.free_destination()
        raise AssertionError(f"unexpected {action}")

    def free_source(self) -> Outcome:
        held, self.source_kv = self.source_kv, False
        self.drop((SubmitPrefill,), (SourceHeld,))
        return Outcome.APPLIED if held else Outcome.NOOP

    def free_destination(self) -> Outcome:
        held, self.destination_kv = self.destination_kv, False
        self.activated = False
        self.drop(
            (ReserveDestination, StartTransfer, ActivateDestination),
            (DestinationReserved, TransferCompleted),
        )
        return Outcome.APPLIED if held else Outcome.NOOP

    def drop(self, actions: tuple[type, ...], facts: tuple[type, ...]) -> None:
        """Forget a canceled side's unanswered actions and unreported facts."""
        self.pending = [a for a in self.pending if not isinstance(a, actions)]
        self.facts = [f for f in self.facts if not isinstance(f, facts)]

    def activation_applied(self) -> bool:
        return any(
            isinstance(a, ActivateDestination) and self.answered.get(a.id) is Outcome.APPLIED
            for a in self.issued
        )


def run_to_quiescence(runtime: SimulatedRuntime) -> None:
    """Start the coordinator and take random moves until the runtime has none left."""
    runtime.take(runtime.coordinator.start())
    runtime.phases.append(runtime.coordinator.phase)
    while moves := runtime.moves():
        # About one step in NOISE_ODDS is noise; shrinking (towards 0) removes it.
        if runtime.data.draw(st.integers(0, NOISE_ODDS - 1)) == NOISE_ODDS - 1:
            moves = runtime.noise_moves() or moves
        kind, payload = moves[runtime.data.draw(st.integers(0, len(moves) - 1))]
        runtime.step(kind, payload)
        runtime.phases.append(runtime.coordinator.phase)


@pytest.mark.parametrize("order", [SF, DF], ids=["source_first", "destination_first"])
@settings(max_examples=300, deadline=None)
@given(data=st.data(), timing=timings, tokens=st.integers(0, 4096))
def test_random_valid_runtimes_complete_exactly_once_without_leaking_kv(
    order: HandoffOrder, data: st.DataObject, timing: TransferTiming, tokens: int
) -> None:
    """Exactly one Complete, nothing after it, no KV held at the end, phases move forward."""
    runtime = SimulatedRuntime(make_coordinator(order, latency_ms=LATENCY_MS), data, timing, tokens)
    run_to_quiescence(runtime)
    c, issued = runtime.coordinator, runtime.issued
    completes = [a for a in issued if isinstance(a, Complete)]
    assert len(completes) == 1 and issued[-1] is completes[0]
    assert c.is_complete and c.completion is completes[0].completion
    assert phase(c) is P.DONE
    assert not runtime.source_kv and not runtime.destination_kv and not runtime.pending
    kinds = {type(a) for a in issued}
    if SubmitPrefill in kinds:
        assert kinds & {ReleaseSource, CancelSource}
    if ReserveDestination in kinds:
        assert CancelDestination in kinds or (runtime.activation_applied() and runtime.decode_done)
    ranks = [PHASE_ORDER[order].index(p) for p in runtime.phases]
    assert ranks == sorted(ranks), "the phase went backwards"
    if c.completion is Completion.SUCCESS:
        assert c.lifecycle == NORMALIZED_LIFECYCLE[order]
        assert c.cleanup_reason is None
    else:
        assert c.cleanup_reason is not None
        assert c.lifecycle[-1] is LifecycleEvent.CANCELED
    source_cleanups = {LifecycleEvent.SOURCE_RELEASED, LifecycleEvent.SOURCE_CANCELED}
    assert sum(event in source_cleanups for event in c.lifecycle) == (SubmitPrefill in kinds)
