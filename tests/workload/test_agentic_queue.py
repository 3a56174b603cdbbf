"""The agentic scheduler alone: when each node of a dependency graph is released.

No cluster: the test plays the loop, releasing what is ready and reporting
ends at chosen times, so every release time is exact.
"""

from __future__ import annotations

import pytest

from servesim.errors import TraceError
from servesim.workload.admission import Released
from servesim.workload.agentic import AgenticGraph, AgenticQueue, Node, Trigger, build_graph
from servesim.workload.request import BlockContentCache, RequestSpec, TracePrompt

Dep = tuple[str, Trigger, float, str]


def _graph(*rows: tuple[str, str, float, list[Dep]]) -> AgenticGraph:
    """Nodes (request id, play id, not_before_ms, dependencies), each a 4-token request."""
    cache = BlockContentCache()
    nodes = [
        Node(
            request_id=rid,
            play_id=play,
            spec=RequestSpec(prompt=TracePrompt((i,), 4, 4, cache), output_length=2),
            not_before_ms=not_before,
            where=f"trace:{i + 1}",
        )
        for i, (rid, play, not_before, _) in enumerate(rows)
    ]
    return build_graph(
        nodes, [deps for *_, deps in rows], block_size=4, source={}, source_models=["m"]
    )


def _ids(queue: AgenticQueue, released: list[Released]) -> list[str]:
    return [queue.graph.nodes[r.session].request_id for r in released]


def _end(queue: AgenticQueue, released: list[Released], rid: str, now: float) -> None:
    (item,) = [r for r in released if queue.graph.nodes[r.session].request_id == rid]
    queue.on_finished(item, now)


def test_dispatch_dependency_releases_child_its_delay_after_parent_dispatch() -> None:
    """A child spawned on dispatch is ready 5 ms after its parent left, while the parent runs."""
    queue = AgenticQueue(
        _graph(
            ("root", "p", 0.0, []), ("child", "p", 0.0, [("root", Trigger.DISPATCH, 5.0, "spawn")])
        )
    )
    first = queue.release(0.0)
    assert _ids(queue, first) == ["root"]
    assert queue.ready_ms == 5.0
    assert queue.release(4.999) == []
    assert _ids(queue, queue.release(5.0)) == ["child"]


def test_completion_dependency_waits_for_the_end_plus_delay() -> None:
    """A completion dependency is not ready until its parent ends; then after the delay."""
    queue = AgenticQueue(
        _graph(("a", "p", 0.0, []), ("b", "p", 0.0, [("a", Trigger.COMPLETION, 15.0, "sequence")]))
    )
    released = queue.release(0.0)
    assert queue.ready_ms == float("inf")
    _end(queue, released, "a", 30.0)
    assert queue.ready_ms == 45.0
    assert _ids(queue, queue.release(45.0)) == ["b"]


def test_join_is_ready_at_the_latest_of_its_dependencies() -> None:
    """Fan-out to two children, join after both (2 ms) and the root (0 ms): the later wins."""
    queue = AgenticQueue(
        _graph(
            ("root", "p", 0.0, []),
            ("c0", "p", 0.0, [("root", Trigger.COMPLETION, 15.0, "spawn")]),
            ("c1", "p", 0.0, [("root", Trigger.COMPLETION, 15.0, "spawn")]),
            (
                "join",
                "p",
                0.0,
                [
                    ("root", Trigger.COMPLETION, 0.0, "sequence"),
                    ("c0", Trigger.COMPLETION, 2.0, "join"),
                    ("c1", Trigger.COMPLETION, 2.0, "join"),
                ],
            ),
        )
    )
    root = queue.release(0.0)
    _end(queue, root, "root", 10.0)
    kids = queue.release(25.0)
    assert _ids(queue, kids) == ["c0", "c1"]
    _end(queue, kids, "c1", 40.0)
    assert queue.ready_ms == float("inf")  # c0 still runs
    _end(queue, kids, "c0", 50.0)
    assert queue.ready_ms == 52.0
    join = queue.release(52.0)
    _end(queue, join, "join", 60.0)
    assert queue.drained()
    assert queue.trajectory_latencies() == [60.0]


def test_roots_start_at_not_before_and_trajectory_counts_from_there() -> None:
    """Without lanes a play starts at its root's not_before_ms; its latency counts from it."""
    queue = AgenticQueue(_graph(("a", "p0", 0.0, []), ("b", "p1", 200.0, [])))
    first = queue.release(0.0)
    assert queue.ready_ms == 200.0
    second = queue.release(200.0)
    _end(queue, first, "a", 30.0)
    _end(queue, second, "b", 250.0)
    assert queue.trajectory_latencies() == [30.0, 50.0]
    outcomes = queue.play_outcomes()
    assert [(o["play_id"], o["settled_at_ms"], o["status"]) for o in outcomes] == [
        ("p0", 30.0, "completed"),
        ("p1", 250.0, "completed"),
    ]


def test_lanes_take_plays_in_string_order_and_ignore_not_before() -> None:
    """One lane: play0, then play1, play10, play2 (string order), each when the last ends."""
    names = ["play0", "play1", "play2", "play10"]
    queue = AgenticQueue(
        _graph(*[(f"{n}-r", n, 100.0 * i, []) for i, n in enumerate(names)]), lanes=1
    )
    order, now = [], 0.0
    while not queue.drained():
        released = queue.release(now)
        assert len(released) == 1 and released[0].arrival_ms == now
        order += _ids(queue, released)
        now += 7.0
        queue.on_finished(released[0], now)
    assert order == ["play0-r", "play1-r", "play10-r", "play2-r"]
    assert queue.trajectory_latencies() == [7.0, 7.0, 7.0, 7.0]


def test_two_lanes_start_two_plays_then_refill() -> None:
    """Two lanes start the first two plays at 0; the third starts when either ends."""
    queue = AgenticQueue(
        _graph(("a", "pa", 500.0, []), ("b", "pb", 0.0, []), ("c", "pc", 0.0, [])), lanes=2
    )
    released = queue.release(0.0)
    assert _ids(queue, released) == ["a", "b"]
    _end(queue, released, "b", 12.0)
    assert _ids(queue, queue.release(12.0)) == ["c"]


def test_dangling_parent_duplicate_self_and_cycle_are_refused() -> None:
    """Each bad graph names the line and the request."""
    dep = ("x", Trigger.COMPLETION, 0.0, "sequence")
    with pytest.raises(TraceError, match=r"trace:1: request 'a' depends on unknown request 'x'"):
        _graph(("a", "p", 0.0, [dep]))
    with pytest.raises(TraceError, match=r"trace:2: duplicate request_id 'a'"):
        _graph(("a", "p", 0.0, []), ("a", "p", 0.0, []))
    with pytest.raises(TraceError, match=r"request 'a' depends on itself"):
        _graph(("a", "p", 0.0, [("a", Trigger.DISPATCH, 0.0, "spawn")]))
    with pytest.raises(TraceError, match=r"trace:1: request 'a' is on a dependency cycle"):
        _graph(
            ("a", "p", 0.0, [("b", Trigger.COMPLETION, 0.0, "sequence")]),
            ("b", "p", 0.0, [("a", Trigger.COMPLETION, 0.0, "sequence")]),
        )


def test_not_before_counts_from_the_earliest_and_holds_children_too() -> None:
    """Roots at 10 and 50 (origin 10): released at 0 and 40; a child with not_before 100 waits
    for 90 even though its parent completed at 20 (the reference's rule, probed)."""
    queue = AgenticQueue(
        _graph(
            ("r", "p", 10.0, []),
            ("c", "p", 100.0, [("r", Trigger.COMPLETION, 1.0, "sequence")]),
            ("q", "p2", 50.0, []),
        )
    )
    first = queue.release(0.0)
    assert _ids(queue, first) == ["r"]
    _end(queue, first, "r", 20.0)
    assert queue.ready_ms == 40.0
    assert _ids(queue, queue.release(40.0)) == ["q"]
    assert queue.ready_ms == 90.0


def test_speedup_divides_not_before_and_delays() -> None:
    """Speed-up 2: a root at not_before 10 (origin 0, another node's) is released at 5, its
    dispatch child (8 ms) at 9, its completion child (10 ms) 5 ms after it ends."""
    queue = AgenticQueue(
        _graph(
            ("r", "p", 10.0, []),
            ("c", "p", 0.0, [("r", Trigger.COMPLETION, 10.0, "sequence")]),
            ("d", "p", 0.0, [("r", Trigger.DISPATCH, 8.0, "spawn")]),
        ),
        speedup=2.0,
    )
    assert queue.ready_ms == 5.0
    root = queue.release(5.0)
    assert queue.ready_ms == 9.0
    assert _ids(queue, queue.release(9.0)) == ["d"]
    _end(queue, root, "r", 40.0)
    assert queue.ready_ms == 45.0


def test_lanes_name_each_request_s_lane() -> None:
    """A play takes the lane the play before it freed."""
    queue = AgenticQueue(
        _graph(("a", "pa", 0.0, []), ("b", "pb", 0.0, []), ("c", "pc", 0.0, [])), lanes=2
    )
    released = queue.release(0.0)
    _end(queue, released, "b", 3.0)
    queue.release(3.0)
    lanes = {n.request_id: (n.spec.agentic or {}).get("lane_id") for n in queue.graph.nodes}
    assert lanes == {"a": "lane:0", "b": "lane:1", "c": "lane:1"}
