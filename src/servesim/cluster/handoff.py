"""The per-request prefill/decode handoff coordinator: a pure state machine.

In disaggregated serving, a prefill worker (the *source*) computes the prompt's KV
and a decode worker (the *destination*) gets a copy of it and generates the output.
One :class:`HandoffCoordinator` per request decides what happens next. It knows
nothing about workers or time: the runtime gives it *facts* (what the engines
report) and *outcomes* (how each action went) and carries out the *actions* it
returns. Each action waits for one outcome; some facts are allowed only after an
outcome (the guards).

The two orders differ only in which side goes first::

      SOURCE_FIRST (vLLM, TRT-LLM)             DESTINATION_FIRST (SGLang)

   SubmitPrefill ─► SUBMITTED              ReserveDestination ─► ACCEPTED
        │ fact SourceHeld{timing}               │ fact DestinationReserved{tokens}
        ▼                                       ▼
   ReserveDestination ─► ACCEPTED          SubmitPrefill ─► SUBMITTED
        │ fact DestinationReserved{tokens}      │ fact SourceHeld{timing}
        └───────────────────┬───────────────────┘
                            ▼
               StartTransfer{delay_ms} ─► SCHEDULED
                            │ fact TransferCompleted
                            ▼
               ActivateDestination ─► APPLIED
                            ▼
               ReleaseSource ─► APPLIED | NOOP
                            ▼
               Complete{SUCCESS}

   "A ─► O": the coordinator issues action A; the runtime answers outcome O.
   "│ fact F": the fact that lets the next action go.

So SOURCE_FIRST holds the prefill KV while it waits for a decode slot, and
DESTINATION_FIRST holds the decode KV while the prefill queues and runs.

A ``Failed``/``TimedOut``/``Canceled`` fact, or a FAILED outcome of any action but
a cancel, switches the coordinator to *cleanup*: it cancels each side it has
started and not yet cleaned up (``CancelSource``, ``CancelDestination``, both at
once if need be), then issues ``Complete{CANCELED}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, auto
from functools import partial
from typing import Final, TypeAlias, assert_never

from servesim.errors import SimulationError

__all__ = [
    "NORMALIZED_LIFECYCLE",
    "Action",
    "ActivateDestination",
    "CancelDestination",
    "CancelSource",
    "Canceled",
    "Complete",
    "Completion",
    "DestinationReserved",
    "Fact",
    "Failed",
    "HandoffCoordinator",
    "HandoffError",
    "HandoffOrder",
    "HandoffPhase",
    "LifecycleEvent",
    "Outcome",
    "ReleaseSource",
    "ReserveDestination",
    "SourceHeld",
    "StartTransfer",
    "SubmitPrefill",
    "TimedOut",
    "TransferCompleted",
    "TransferMode",
    "TransferTiming",
]


class HandoffError(SimulationError):
    """The runtime broke the handoff protocol: a guard, an outcome or a phase rule."""


# ----------------------------------------------------------------------------- enums


class HandoffOrder(Enum):
    """Which side of the handoff is set up first."""

    SOURCE_FIRST = auto()
    """Prefill first, then reserve the decode side (vLLM, TRT-LLM)."""
    DESTINATION_FIRST = auto()
    """Reserve the decode side first, then prefill (SGLang)."""


class HandoffPhase(Enum):
    """Where a disaggregated request is; see :class:`HandoffCoordinator` for the transitions."""

    QUEUED_PREFILL = auto()
    RUNNING_PREFILL = auto()
    AWAITING_DESTINATION = auto()
    TRANSFER_PENDING = auto()
    READY_DECODE = auto()
    RUNNING_DECODE = auto()
    CLEANUP_PENDING = auto()
    DONE = auto()


class Outcome(Enum):
    """How the runtime reports an action went."""

    SUBMITTED = auto()
    ACCEPTED = auto()
    SCHEDULED = auto()
    APPLIED = auto()
    NOOP = auto()
    FAILED = auto()


class Completion(Enum):
    """How a handoff ended, carried by :class:`Complete`."""

    SUCCESS = auto()
    CANCELED = auto()


class TransferMode(Enum):
    """Which prompt tokens a KV transfer moves."""

    FULL_PROMPT = auto()
    """The whole prompt's KV."""
    DESTINATION_MISSING = auto()
    """Only the tokens the destination lacks (its prefix cache supplies the rest)."""


class LifecycleEvent(Enum):
    """A normalized handoff step, recorded for conformance tests."""

    SOURCE_HELD = auto()
    DESTINATION_ACCEPTED = auto()
    DESTINATION_RESERVED = auto()
    DESTINATION_ACTIVATED = auto()
    SOURCE_RELEASED = auto()
    COMPLETED = auto()
    SOURCE_CANCELED = auto()
    DESTINATION_CANCELED = auto()
    CANCELED = auto()


NORMALIZED_LIFECYCLE: Final[dict[HandoffOrder, tuple[LifecycleEvent, ...]]] = {
    HandoffOrder.SOURCE_FIRST: (
        LifecycleEvent.SOURCE_HELD,
        LifecycleEvent.DESTINATION_ACCEPTED,
        LifecycleEvent.DESTINATION_RESERVED,
        LifecycleEvent.DESTINATION_ACTIVATED,
        LifecycleEvent.SOURCE_RELEASED,
        LifecycleEvent.COMPLETED,
    ),
    HandoffOrder.DESTINATION_FIRST: (
        LifecycleEvent.DESTINATION_ACCEPTED,
        LifecycleEvent.DESTINATION_RESERVED,
        LifecycleEvent.SOURCE_HELD,
        LifecycleEvent.DESTINATION_ACTIVATED,
        LifecycleEvent.SOURCE_RELEASED,
        LifecycleEvent.COMPLETED,
    ),
}
"""The lifecycle of a successful handoff, per order."""


# ------------------------------------------------------------------ transfer timing


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferTiming:
    """What the source publishes with ``SourceHeld`` to price the KV transfer.

    Invariants: token counts and byte sizes are finite and non-negative. The
    bandwidth may be anything; an unusable one (``None``, non-finite, ≤ 0) means
    "no standalone delay" and the coordinator falls back to its fixed latency.
    """

    mode: TransferMode = TransferMode.FULL_PROMPT
    full_prompt_tokens: int
    kv_bytes_per_token: float | None
    kv_bytes_per_request: float = 0.0
    bandwidth_gb_s: float | None
    """Source-side bandwidth in decimal GB/s (1e9 bytes per second)."""

    def __post_init__(self) -> None:
        if self.full_prompt_tokens < 0:
            raise ValueError(f"negative full_prompt_tokens {self.full_prompt_tokens}")
        for name in ("kv_bytes_per_token", "kv_bytes_per_request"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")

    def delay_ms(self, destination_missing_tokens: int) -> float | None:
        """The standalone transfer time, alone on the link.

        ``delay = (tokens × kv_bytes_per_token + kv_bytes_per_request) /
        (bandwidth_gb_s × 1e9) × 1000`` ms, where ``tokens`` is the full prompt
        (FULL_PROMPT) or ``destination_missing_tokens`` (DESTINATION_MISSING).

        Args:
            destination_missing_tokens: Prompt tokens the destination lacks (from
                ``DestinationReserved``); 0 on a full destination cache hit.

        Returns:
            The delay in ms, or ``None`` when the bandwidth is unusable or no KV
            size is known (no per-token size and no per-request bytes).

        Raises:
            ValueError: ``destination_missing_tokens`` is negative.
        """
        if destination_missing_tokens < 0:
            raise ValueError(f"negative destination_missing_tokens {destination_missing_tokens}")
        bandwidth = self.bandwidth_gb_s
        if bandwidth is None or not math.isfinite(bandwidth) or bandwidth <= 0:
            return None
        if self.kv_bytes_per_token is None and self.kv_bytes_per_request == 0:
            return None
        tokens = (
            self.full_prompt_tokens
            if self.mode is TransferMode.FULL_PROMPT
            else destination_missing_tokens
        )
        total_bytes = tokens * (self.kv_bytes_per_token or 0.0) + self.kv_bytes_per_request
        # Seconds, then ms, rounded as the reference rounds them: 4,194,304 B at 1 GB/s
        # take 4.194304000000001 ms (bytes / (GB/s x 1e6) gives 4.194304), and two
        # transfers' ends that miss each other by one float step in the reference
        # would otherwise tie (differential seed 634, disagg_transfer_rounding_tie).
        return total_bytes / (bandwidth * 1e9) * 1000.0


# ------------------------------------------------------------------------ actions


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitPrefill:
    """Route the prompt to a prefill worker and submit it (expects SUBMITTED)."""

    id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReserveDestination:
    """Route the request to a decode worker and reserve its KV (expects ACCEPTED)."""

    id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StartTransfer:
    """Start copying the KV from source to destination (expects SCHEDULED)."""

    id: int
    delay_ms: float
    """Standalone transfer time; 0 means the transfer completes at once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivateDestination:
    """Make the transferred KV live on the decode worker (expects APPLIED)."""

    id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseSource:
    """Free the source's KV after a successful handoff (expects APPLIED or NOOP)."""

    id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelSource:
    """Cancel the prefill side, routed or not (expects APPLIED or NOOP)."""

    id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelDestination:
    """Cancel the decode side, routed or not (expects APPLIED or NOOP)."""

    id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Complete:
    """The handoff is over; the last action, with no outcome."""

    id: int
    completion: Completion


Action: TypeAlias = (
    SubmitPrefill
    | ReserveDestination
    | StartTransfer
    | ActivateDestination
    | ReleaseSource
    | CancelSource
    | CancelDestination
    | Complete
)
"""An instruction from the coordinator to the runtime."""

_EXPECTED_OUTCOMES: Final[dict[type[Action], frozenset[Outcome]]] = {
    SubmitPrefill: frozenset({Outcome.SUBMITTED, Outcome.FAILED}),
    ReserveDestination: frozenset({Outcome.ACCEPTED, Outcome.FAILED}),
    StartTransfer: frozenset({Outcome.SCHEDULED, Outcome.FAILED}),
    ActivateDestination: frozenset({Outcome.APPLIED, Outcome.FAILED}),
    ReleaseSource: frozenset({Outcome.APPLIED, Outcome.NOOP, Outcome.FAILED}),
    CancelSource: frozenset({Outcome.APPLIED, Outcome.NOOP}),
    CancelDestination: frozenset({Outcome.APPLIED, Outcome.NOOP}),
    Complete: frozenset(),
}
"""The outcomes each action may get. A FAILED cancel is not one of them: nothing can clean up after it."""


# -------------------------------------------------------------------------- facts


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceHeld:
    """Prefill is done and the source keeps the prompt's KV until released."""

    timing: TransferTiming


@dataclass(frozen=True, slots=True, kw_only=True)
class DestinationReserved:
    """The destination's KV is allocated; it lacks ``transferable_prompt_tokens`` tokens."""

    transferable_prompt_tokens: int

    def __post_init__(self) -> None:
        if self.transferable_prompt_tokens < 0:
            raise ValueError(
                f"negative transferable_prompt_tokens {self.transferable_prompt_tokens}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferCompleted:
    """The KV copy has arrived at the destination."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Failed:
    """The request failed (e.g. a prefill rejection); start cleanup."""

    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TimedOut:
    """The request timed out; start cleanup."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Canceled:
    """The client canceled the request; start cleanup."""


Fact: TypeAlias = (
    SourceHeld | DestinationReserved | TransferCompleted | Failed | TimedOut | Canceled
)
"""Something the runtime observed about the request."""


# -------------------------------------------------------------------- coordinator


class _Mode(Enum):
    """The coordinator's own lifecycle, apart from the request's phase."""

    NEW = auto()  # start() not called yet
    ACTIVE = auto()  # driving the handoff forward (rules 1-7)
    CLEANUP = auto()  # canceling the sides it started
    COMPLETE = auto()  # Complete issued; issues nothing more


_P = HandoffPhase

# The members the coordinator reads on every fact and outcome, as globals: a read through
# an enum class costs ~15x a global's on Python 3.11 (EnumType.__getattr__).
_NEW, _ACTIVE, _CLEANUP = _Mode.NEW, _Mode.ACTIVE, _Mode.CLEANUP
_APPLIED, _FAILED = Outcome.APPLIED, Outcome.FAILED
_SOURCE_FIRST = HandoffOrder.SOURCE_FIRST
_NOT_DONE: Final = tuple(phase for phase in HandoffPhase if phase is not HandoffPhase.DONE)

_MakeAction: TypeAlias = Callable[..., Action]
"""An action class, or a ``partial`` of one, still missing its ``id``."""


class HandoffCoordinator:
    """Decides the next actions of one request's prefill→decode handoff.

    Feed it with :meth:`start`, :meth:`on_fact` and :meth:`on_outcome`; each
    returns the actions to execute, in order, with ids 0, 1, 2, … in issue order.
    In active mode the first matching rule issues one action, repeated until
    none matches:

    1. ``start()``: SubmitPrefill (SOURCE_FIRST) or ReserveDestination (DESTINATION_FIRST).
    2. SOURCE_FIRST, source held, reserve not issued → ReserveDestination.
    3. DESTINATION_FIRST, destination reserved, submit not issued → SubmitPrefill.
    4. Source held and destination reserved, no transfer yet → StartTransfer, priced by
       ``timing.delay_ms(transferable tokens)``, else ``handoff_latency_ms``.
    5. Transfer completed, activation not issued → ActivateDestination.
    6. Activation APPLIED, release not issued → ReleaseSource.
    7. Release APPLIED or NOOP → Complete(SUCCESS).

    Phase transitions, each checking its source phase:

    ====================  =================================================  ===================
    phase                 entered when                                       where
    ====================  =================================================  ===================
    QUEUED_PREFILL        initial (SOURCE_FIRST); SubmitPrefill issued       ``__init__``, issue
    RUNNING_PREFILL       SubmitPrefill → SUBMITTED                          ``on_outcome``
    AWAITING_DESTINATION  initial (DESTINATION_FIRST); ReserveDestination    ``__init__``, issue
                          issued
    TRANSFER_PENDING      StartTransfer → SCHEDULED                          ``on_outcome``
    READY_DECODE          ActivateDestination → APPLIED                      ``on_outcome``
    RUNNING_DECODE        the decode engine admitted the request             ``decode_admitted``
    CLEANUP_PENDING       decode finished, or cleanup mode entered           ``decode_finished``,
                                                                             facts, outcomes
    DONE                  Complete(SUCCESS) issued and decode finished       issue,
                          (either order), or Complete(CANCELED) issued       ``decode_finished``
    ====================  =================================================  ===================

    Invariants: each action kind is issued at most once; every action but
    :class:`Complete` gets exactly one outcome (repeats of it are ignored);
    nothing is issued after :class:`Complete`; facts count only in active mode,
    and only once each; once cleanup has started, the decode side's reports
    (:meth:`decode_admitted`, :meth:`decode_finished`) are ignored, since a pass
    in flight may still report on a request being canceled.
    """

    def __init__(self, order: HandoffOrder, *, handoff_latency_ms: float = 0.0) -> None:
        """Create the coordinator of one request, not started yet.

        Args:
            order: Which side goes first.
            handoff_latency_ms: The transfer delay used when the source's timing
                cannot price the transfer.

        Raises:
            ValueError: ``handoff_latency_ms`` is negative or not finite.
        """
        if not (math.isfinite(handoff_latency_ms) and handoff_latency_ms >= 0):
            raise ValueError(
                f"handoff_latency_ms must be finite and >= 0, got {handoff_latency_ms}"
            )
        self._order = order
        self._handoff_latency_ms = handoff_latency_ms
        self._mode = _NEW
        self._phase = _P.QUEUED_PREFILL if order is _SOURCE_FIRST else _P.AWAITING_DESTINATION
        self._actions: dict[int, Action] = {}
        self._id_of: dict[type[Action], int] = {}  # each kind is issued at most once
        self._outcomes: dict[int, Outcome] = {}
        self._timing: TransferTiming | None = None  # set by SourceHeld
        self._transferable_tokens: int | None = None  # set by DestinationReserved
        self._transfer_completed = False
        self._source_clean = False  # released or canceled
        self._destination_clean = False  # decode finished or canceled
        self._decode_finished = False
        self._cleanup_reason: str | None = None
        self._completion: Completion | None = None
        self._lifecycle: list[LifecycleEvent] = []

    def __repr__(self) -> str:
        return (
            f"HandoffCoordinator({self._order.name}, phase={self._phase.name}, "
            f"mode={self._mode.name}, actions={len(self._actions)})"
        )

    # ------------------------------------------------------------------ properties

    @property
    def order(self) -> HandoffOrder:
        """Which side goes first."""
        return self._order

    @property
    def phase(self) -> HandoffPhase:
        """Where the request is."""
        return self._phase

    @property
    def is_active(self) -> bool:
        """Started and still driving the handoff forward (not in cleanup, not complete)."""
        return self._mode is _ACTIVE

    @property
    def is_complete(self) -> bool:
        """Whether :class:`Complete` has been issued."""
        return self._mode is _Mode.COMPLETE

    @property
    def completion(self) -> Completion | None:
        """How the handoff ended; ``None`` until :class:`Complete` is issued."""
        return self._completion

    @property
    def cleanup_reason(self) -> str | None:
        """Why cleanup started (the first failure, time-out or cancel); ``None`` if it has not."""
        return self._cleanup_reason

    @property
    def lifecycle(self) -> tuple[LifecycleEvent, ...]:
        """The normalized steps so far (see :data:`NORMALIZED_LIFECYCLE`).

        Facts and successful outcomes in the order they arrived, then COMPLETED or
        CANCELED when :class:`Complete` is issued. Each side's cleanup (released,
        canceled) is recorded once, by whichever outcome cleaned it first.
        """
        return tuple(self._lifecycle)

    # --------------------------------------------------------------------- inputs

    def start(self) -> list[Action]:
        """Issue the first action (rule 1).

        Returns:
            ``[SubmitPrefill]`` for SOURCE_FIRST, ``[ReserveDestination]`` otherwise.

        Raises:
            HandoffError: The coordinator was already started.
        """
        if self._mode is not _NEW:
            raise HandoffError(f"{self!r} already started")
        self._mode = _ACTIVE
        if self._order is _SOURCE_FIRST:
            return [self._issue(SubmitPrefill)]
        return [self._issue(ReserveDestination)]

    def on_fact(self, fact: Fact) -> list[Action]:
        """Take in an observed fact and return the actions it unlocks.

        A fact already seen, or one arriving outside active mode, is ignored.

        Raises:
            HandoffError: Not started, or a guard fails: ``SourceHeld`` before
                SubmitPrefill was SUBMITTED, ``DestinationReserved`` before
                ReserveDestination was ACCEPTED, ``TransferCompleted`` before
                StartTransfer was SCHEDULED.
        """
        if self._mode is _NEW:
            raise HandoffError(f"{self!r} got fact {fact} before start()")
        if self._mode is not _ACTIVE:
            return []
        self._apply_fact(fact)
        return self._advance()

    def on_outcome(self, action_id: int, outcome: Outcome, *, message: str = "") -> list[Action]:
        """Take in how an action went and return the actions it unlocks.

        A repeat of the outcome already recorded for the action is ignored (its
        message is not compared).

        Args:
            action_id: The ``id`` of an issued action.
            outcome: One of the outcomes that action expects, or FAILED.
            message: Why it FAILED; only with FAILED.

        Raises:
            HandoffError: Unknown action id, an outcome the action cannot have (a
                FAILED cancel included), or one that conflicts with the recorded one.
            ValueError: A message with an outcome other than FAILED.
        """
        action = self._action(action_id)
        if message and outcome is not _FAILED:
            raise ValueError(f"message {message!r} given with outcome {outcome.name}")
        recorded = self._outcomes.get(action_id)
        if recorded is outcome:
            return []
        if recorded is not None:
            raise HandoffError(f"{action} got {outcome.name} after {recorded.name}")
        self._check_outcome(action, outcome, message)
        self._outcomes[action_id] = outcome
        if outcome is _FAILED:
            self._enter_cleanup(f"{type(action).__name__} failed: {message}")
        else:
            self._apply_outcome(action)
        return self._advance()

    def decode_admitted(self) -> None:
        """The decode engine admitted the request: READY_DECODE → RUNNING_DECODE.

        Raises:
            HandoffError: The phase is not READY_DECODE (unless cleanup has started).
        """
        if self._cleanup_reason is None:
            self._move(_P.RUNNING_DECODE, _P.READY_DECODE)

    def decode_finished(self) -> None:
        """The decode engine finished the request (or rejected it): → CLEANUP_PENDING.

        The destination's KV is freed with it, so cleanup will not cancel the
        destination. If the handoff already completed, the request is DONE.

        Raises:
            HandoffError: The phase is not READY_DECODE or RUNNING_DECODE (unless
                cleanup has started).
        """
        if self._cleanup_reason is not None:
            return
        self._move(_P.CLEANUP_PENDING, _P.READY_DECODE, _P.RUNNING_DECODE)
        self._decode_finished = True
        self._destination_clean = True
        if self._completion is Completion.SUCCESS:
            self._move(_P.DONE, _P.CLEANUP_PENDING)

    # ---------------------------------------------------------------------- facts

    def _apply_fact(self, fact: Fact) -> None:
        match fact:
            case SourceHeld(timing=timing):
                self._on_source_held(timing)
            case DestinationReserved(transferable_prompt_tokens=tokens):
                self._on_destination_reserved(tokens)
            case TransferCompleted():
                self._require(StartTransfer, Outcome.SCHEDULED, fact)
                self._transfer_completed = True
            case Failed(reason=reason):
                self._enter_cleanup(reason)
            case TimedOut():
                self._enter_cleanup("timed out")
            case Canceled():
                self._enter_cleanup("canceled")
            case _:
                assert_never(fact)

    def _on_source_held(self, timing: TransferTiming) -> None:
        if self._timing is not None:
            return
        self._require(SubmitPrefill, Outcome.SUBMITTED, SourceHeld(timing=timing))
        self._timing = timing
        self._lifecycle.append(LifecycleEvent.SOURCE_HELD)

    def _on_destination_reserved(self, tokens: int) -> None:
        if self._transferable_tokens is not None:
            return
        fact = DestinationReserved(transferable_prompt_tokens=tokens)
        self._require(ReserveDestination, Outcome.ACCEPTED, fact)
        self._transferable_tokens = tokens
        self._lifecycle.append(LifecycleEvent.DESTINATION_RESERVED)

    def _require(self, kind: type[Action], outcome: Outcome, fact: Fact) -> None:
        """Guard: ``fact`` may only follow ``kind``'s ``outcome``."""
        if self._outcome_of(kind) is not outcome:
            raise HandoffError(f"{fact} before {kind.__name__} was {outcome.name}")

    def _enter_cleanup(self, reason: str) -> None:
        if self._mode is not _ACTIVE:
            return  # already cleaning up, or complete
        self._mode = _CLEANUP
        self._cleanup_reason = reason
        self._move(_P.CLEANUP_PENDING, *_NOT_DONE)

    # ------------------------------------------------------------------- outcomes

    def _action(self, action_id: int) -> Action:
        try:
            return self._actions[action_id]
        except KeyError:
            raise HandoffError(f"outcome for unknown action id {action_id}") from None

    @staticmethod
    def _check_outcome(action: Action, outcome: Outcome, message: str) -> None:
        if outcome is _FAILED and isinstance(action, CancelSource | CancelDestination):
            raise HandoffError(f"{action} failed ({message}); a failed cancel cannot be cleaned up")
        expected = _EXPECTED_OUTCOMES[type(action)]
        if outcome not in expected:
            names = sorted(o.name for o in expected) or ["none"]
            raise HandoffError(f"{action} cannot have outcome {outcome.name}; expects {names}")

    def _apply_outcome(self, action: Action) -> None:
        """Record a successful (non-FAILED) outcome of ``action``."""
        match action:
            case SubmitPrefill():
                self._move_if_active(_P.RUNNING_PREFILL, _P.QUEUED_PREFILL)
            case ReserveDestination():
                self._lifecycle.append(LifecycleEvent.DESTINATION_ACCEPTED)
            case StartTransfer():
                self._move_if_active(
                    _P.TRANSFER_PENDING, _P.AWAITING_DESTINATION, _P.RUNNING_PREFILL
                )
            case ActivateDestination():
                self._lifecycle.append(LifecycleEvent.DESTINATION_ACTIVATED)
                self._move_if_active(_P.READY_DECODE, _P.TRANSFER_PENDING)
            case ReleaseSource():
                self._clean_source(LifecycleEvent.SOURCE_RELEASED)
            case CancelSource():
                self._clean_source(LifecycleEvent.SOURCE_CANCELED)
            case CancelDestination():
                self._clean_destination(LifecycleEvent.DESTINATION_CANCELED)
            case Complete():
                raise AssertionError("Complete expects no outcome; _check_outcome lets none in")

    def _clean_source(self, event: LifecycleEvent) -> None:
        # A release and a cancel may both be answered (cleanup began while the
        # release was outstanding); the first frees the KV, the other is a no-op
        # and is not recorded, so the lifecycle names one cleanup per side.
        if not self._source_clean:
            self._source_clean = True
            self._lifecycle.append(event)

    def _clean_destination(self, event: LifecycleEvent) -> None:
        if not self._destination_clean:  # decode may have freed it already
            self._destination_clean = True
            self._lifecycle.append(event)

    # -------------------------------------------------------------------- actions

    def _advance(self) -> list[Action]:
        """Apply the rules of the current mode until none matches."""
        issued: list[Action] = []
        while (action := self._next_action()) is not None:
            issued.append(action)
        return issued

    def _next_action(self) -> Action | None:
        if self._mode is _ACTIVE:
            return self._next_active()
        if self._mode is _CLEANUP:
            return self._next_cleanup()
        return None

    def _next_active(self) -> Action | None:
        """Rules 2-7: the first one that matches issues one action."""
        held = self._timing is not None
        reserved = self._transferable_tokens is not None
        source_first = self._order is _SOURCE_FIRST
        issued = self._id_of  # (what _issued asks, read once: this runs after every step)
        if source_first and held and ReserveDestination not in issued:
            return self._issue(ReserveDestination)
        if not source_first and reserved and SubmitPrefill not in issued:
            return self._issue(SubmitPrefill)
        if held and reserved and StartTransfer not in issued:
            return self._issue(partial(StartTransfer, delay_ms=self._transfer_delay_ms()))
        if self._transfer_completed and ActivateDestination not in issued:
            return self._issue(ActivateDestination)
        if ReleaseSource not in issued and self._outcome_of(ActivateDestination) is _APPLIED:
            return self._issue(ReleaseSource)
        if self._source_clean:
            return self._issue(partial(Complete, completion=Completion.SUCCESS))
        return None

    def _next_cleanup(self) -> Action | None:
        """Cancel each outstanding side once; complete when neither is outstanding."""
        source_outstanding = self._issued(SubmitPrefill) and not self._source_clean
        destination_outstanding = self._issued(ReserveDestination) and not self._destination_clean
        if source_outstanding and not self._issued(CancelSource):
            return self._issue(CancelSource)
        if destination_outstanding and not self._issued(CancelDestination):
            return self._issue(CancelDestination)
        if not (source_outstanding or destination_outstanding):
            return self._issue(partial(Complete, completion=Completion.CANCELED))
        return None

    def _transfer_delay_ms(self) -> float:
        assert self._timing is not None and self._transferable_tokens is not None
        delay = self._timing.delay_ms(self._transferable_tokens)
        return self._handoff_latency_ms if delay is None else delay

    def _issue(self, make: _MakeAction) -> Action:
        """Create the next action with the next id and apply its phase change."""
        action = make(id=len(self._actions))
        self._actions[action.id] = action
        self._id_of[type(action)] = action.id
        match action:
            case SubmitPrefill():
                self._move(_P.QUEUED_PREFILL, _P.QUEUED_PREFILL, _P.AWAITING_DESTINATION)
            case ReserveDestination():
                self._move(_P.AWAITING_DESTINATION, _P.AWAITING_DESTINATION, _P.RUNNING_PREFILL)
            case Complete(completion=completion):
                self._complete(completion)
        return action

    def _complete(self, completion: Completion) -> None:
        self._mode = _Mode.COMPLETE
        self._completion = completion
        if completion is Completion.CANCELED:
            self._lifecycle.append(LifecycleEvent.CANCELED)
            self._move(_P.DONE, _P.CLEANUP_PENDING)
        else:
            self._lifecycle.append(LifecycleEvent.COMPLETED)
            if self._decode_finished:
                self._move(_P.DONE, _P.CLEANUP_PENDING)

    def _issued(self, kind: type[Action]) -> bool:
        return kind in self._id_of

    def _outcome_of(self, kind: type[Action]) -> Outcome | None:
        action_id = self._id_of.get(kind)
        return None if action_id is None else self._outcomes.get(action_id)

    # --------------------------------------------------------------------- phases

    def _move(self, to: HandoffPhase, *sources: HandoffPhase) -> None:
        """The one place the phase changes; ``sources`` are the phases it may leave."""
        if self._phase not in sources:
            allowed = " or ".join(source.name for source in sources)
            raise HandoffError(
                f"phase {self._phase.name} -> {to.name} needs {allowed} ({self._order.name})"
            )
        self._phase = to

    def _move_if_active(self, to: HandoffPhase, *sources: HandoffPhase) -> None:
        # Outcomes of earlier actions still arrive during cleanup; the phase is
        # CLEANUP_PENDING by then and stays so.
        if self._mode is _ACTIVE:
            self._move(to, *sources)
