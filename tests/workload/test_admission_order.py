"""The order in which the admission queue releases an open loop's turns.

First turns wait in a list sorted by (start, session); later turns are readied
on a heap as their previous turn ends. Both are one order, (ready time,
session, turn): at one instant a readied later turn of a lower session goes
out before a first turn of a higher one, as the reference's ready-session
heap has it, and starts are normalised to the earliest and divided by the
speed-up.
"""

from __future__ import annotations

import math

from servesim.workload.admission import AdmissionQueue
from servesim.workload.request import RequestSpec, Session, SyntheticPrompt


def spec(session: int, turn: int, delay_ms: float = 0.0) -> RequestSpec:
    return RequestSpec(
        prompt=SyntheticPrompt(10 * session + turn, 64),
        output_length=2,
        session_id=f"s{session}",
        turn_index=turn,
        delay_ms=delay_ms,
    )


def released(queue: AdmissionQueue, now: float) -> list[tuple[int, int]]:
    return [(r.session, r.spec.turn_index or 0) for r in queue.release(now)]


def test_a_readied_turn_and_a_first_turn_at_one_instant_go_out_in_session_order() -> None:
    sessions = [
        Session(turns=[spec(0, 0), spec(0, 1, delay_ms=30.0)], start_ms=1000.0),
        Session(turns=[spec(1, 0)], start_ms=1050.0),
        Session(turns=[spec(2, 0)], start_ms=1050.0),  # ties session 1: session order
        Session(turns=[spec(3, 0)], start_ms=1020.0),
    ]
    queue = AdmissionQueue(sessions, speedup=1.0)
    assert queue.ready_ms == 0.0
    (first,) = queue.release(0.0)
    assert (first.session, first.arrival_ms) == (0, 0.0)
    assert queue.ready_ms == 20.0
    assert released(queue, 20.0) == [(3, 0)]
    queue.on_finished(first, 20.0)  # session 0's second turn is ready at 20 + 30 = 50
    assert queue.ready_ms == 50.0
    assert released(queue, 50.0) == [(0, 1), (1, 0), (2, 0)]
    assert queue.ready_ms == math.inf
    assert not queue.drained()


def test_a_readied_turn_of_a_higher_session_waits_behind_a_first_turn_at_its_instant() -> None:
    sessions = [
        Session(turns=[spec(0, 0)], start_ms=60.0),
        Session(turns=[spec(1, 0), spec(1, 1, delay_ms=50.0)], start_ms=0.0),
    ]
    queue = AdmissionQueue(sessions, speedup=2.0)  # starts 30 and 0 ms
    (first,) = queue.release(0.0)
    assert first.session == 1
    queue.on_finished(first, 5.0)  # its second turn: 5 + 50 / 2 = 30, with session 0's start
    assert released(queue, 30.0) == [(0, 0), (1, 1)]


def test_a_free_closed_loop_slot_makes_the_queue_ready_at_once() -> None:
    """``ready_ms`` is -inf while a slot is free for a waiting session; a session keeps
    its slot through its think time, so its next turn's time is then the next ready."""
    sessions = [
        Session(turns=[spec(0, 0), spec(0, 1, delay_ms=30.0)]),
        Session(turns=[spec(1, 0)]),
    ]
    queue = AdmissionQueue(sessions, concurrency=1)
    assert queue.ready_ms == -math.inf
    (first,) = queue.release(5.0)
    assert (first.session, first.arrival_ms) == (0, 5.0)
    assert queue.ready_ms == math.inf  # the slot is taken and nothing else is readied
    queue.on_finished(first, 10.0)
    assert queue.ready_ms == 40.0  # session 0 keeps the slot: its second turn at 10 + 30
    (second,) = queue.release(40.0)
    assert queue.ready_ms == math.inf
    queue.on_finished(second, 45.0)  # session 0 ends: its slot frees for session 1
    assert queue.ready_ms == -math.inf
    assert released(queue, 45.0) == [(1, 0)]
    assert queue.ready_ms == math.inf
