"""Agentic trajectories: requests joined by dependencies, replayed as a graph in virtual time.

A *play* (trajectory) is a set of requests (nodes). A node without
dependencies is ready at its ``not_before_ms``; a node with dependencies is
ready when every one is met, at the latest of their times:

- ``dispatch`` dependency: ``delay_ms`` after the parent is dispatched (handed
  to the cluster), e.g. a sub-agent spawned while its parent runs;
- ``completion`` dependency: ``delay_ms`` after the parent completes (or is
  rejected), e.g. the next turn after a tool call, or a join after children.

Fan-out is several nodes depending on one parent; a join is one node
depending on several. A play ends when its last node ends; its trajectory
end-to-end latency is that end minus the play's start.

Without lanes every node waits for its ``not_before_ms`` too, counted from
the earliest ``not_before_ms`` of the graph; a play starts when its first
root does. ``not_before_ms`` and dependency delays are divided by the
arrival speed-up, as the reference divides them. With ``lanes`` N, N plays run at once: plays are
taken in string order of ``play_id`` (``play0, play1, play10, ...``, as the
reference takes them), the first N start at 0 and each later one when a
play ends, with its roots ready at that moment (``not_before_ms`` ignored).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from servesim.errors import ConfigError, TraceError
from servesim.workload.admission import Released, check_pacing
from servesim.workload.request import RequestSpec


class Trigger(Enum):
    """What of the parent a dependency waits for."""

    DISPATCH = "dispatch"
    COMPLETION = "completion"


@dataclass(frozen=True, slots=True)
class Dependency:
    """The child may start ``delay_ms`` after ``parent`` (a node index) is dispatched or completes."""

    parent: int
    trigger: Trigger
    delay_ms: float
    relation: str = "sequence"


@dataclass(slots=True, kw_only=True)
class Node:
    """One request of an agentic graph."""

    request_id: str
    play_id: str
    spec: RequestSpec
    not_before_ms: float = 0.0
    dependencies: list[Dependency] = field(default_factory=list)
    where: str = ""


@dataclass(slots=True, kw_only=True)
class AgenticGraph:
    """A validated dependency graph: nodes in trace order, every parent known, no cycle."""

    nodes: list[Node]
    block_size: int
    source: dict[str, Any]
    source_models: list[str]

    @property
    def plays(self) -> dict[str, list[int]]:
        """Each play's node indices, plays in order of first appearance."""
        out: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            out.setdefault(node.play_id, []).append(i)
        return out

    def digest(self) -> str:
        """SHA-256 of the graph's canonical JSON (ids, plays, lengths, dependencies)."""
        h = hashlib.sha256()
        for node in self.nodes:
            h.update(
                json.dumps(
                    [
                        node.request_id,
                        node.play_id,
                        node.spec.session_id,
                        node.spec.input_length,
                        node.spec.output_length,
                        node.not_before_ms,
                        [
                            [
                                self.nodes[d.parent].request_id,
                                d.trigger.value,
                                d.delay_ms,
                                d.relation,
                            ]
                            for d in node.dependencies
                        ],
                    ],
                    separators=(",", ":"),
                ).encode()
            )
            h.update(b"\n")
        return h.hexdigest()

    def summary(self) -> dict[str, Any]:
        """The ``agentic_graph`` entry of the report."""
        return {
            "block_size": self.block_size,
            "graph_digest": self.digest(),
            "node_count": len(self.nodes),
            "play_count": len(self.plays),
            "source": self.source,
            "source_models": self.source_models,
        }


def build_graph(
    nodes: list[Node], parents: list[list[tuple[str, Trigger, float, str]]], **graph: Any
) -> AgenticGraph:
    """Resolve each node's dependencies (by request id) and check the graph.

    Raises:
        TraceError: a duplicate or empty request id, a dependency on an unknown
            request or on itself, or a cycle (naming a request on it).
    """
    index: dict[str, int] = {}
    for i, node in enumerate(nodes):
        if not node.request_id:
            raise TraceError(f"{node.where}: 'request_id' must be a non-empty string")
        if node.request_id in index:
            raise TraceError(f"{node.where}: duplicate request_id '{node.request_id}'")
        index[node.request_id] = i
    for node, deps in zip(nodes, parents, strict=True):
        for parent_id, trigger, delay, relation in deps:
            parent = index.get(parent_id)
            if parent is None:
                raise TraceError(
                    f"{node.where}: request '{node.request_id}' depends on unknown request '{parent_id}'"
                )
            if parent_id == node.request_id:
                raise TraceError(f"{node.where}: request '{node.request_id}' depends on itself")
            node.dependencies.append(Dependency(parent, trigger, delay, relation))
    _check_acyclic(nodes)
    out = AgenticGraph(nodes=nodes, **graph)
    _name_lineage(out)
    return out


def _name_lineage(graph: AgenticGraph) -> None:
    """Give each node's request the ids the reference reports with it: its play's first
    root, and the request that spawned it (a ``spawn`` dependency's parent)."""
    nodes = graph.nodes
    for ids in graph.plays.values():
        roots = [i for i in ids if not nodes[i].dependencies]
        root = nodes[roots[0] if roots else ids[0]].request_id
        for i in ids:
            node = nodes[i]
            lineage = {
                "conversation_id": node.spec.session_id or node.request_id,
                "play_id": node.play_id,
                "request_id": node.request_id,
                "root_id": root,
            }
            spawn = next((d for d in node.dependencies if d.relation == "spawn"), None)
            if spawn is not None:
                lineage["parent_id"] = nodes[spawn.parent].request_id
            node.spec.agentic = lineage


def _check_acyclic(nodes: list[Node]) -> None:
    waiting = [len(node.dependencies) for node in nodes]
    children: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        for dep in node.dependencies:
            children[dep.parent].append(i)
    ready = deque(i for i, n in enumerate(waiting) if n == 0)
    done = 0
    while ready:
        i = ready.popleft()
        done += 1
        for child in children[i]:
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    if done < len(nodes):
        stuck = next(i for i, n in enumerate(waiting) if n)
        node = nodes[stuck]
        raise TraceError(
            f"{node.where}: request '{node.request_id}' is on a dependency cycle "
            "(it can never become ready)"
        )


@dataclass(slots=True)
class _Play:
    nodes: list[int]
    left: int
    start_ms: float | None = None
    end_ms: float | None = None
    lane: int | None = None


class AgenticQueue:
    """Releases an agentic graph's requests as their dependencies are met (the admission of agentic runs)."""

    def __init__(
        self, graph: AgenticGraph, *, lanes: int | None = None, speedup: float = 1.0
    ) -> None:
        if lanes is not None and lanes < 1:
            raise ConfigError(f"agentic lanes must be at least 1, got {lanes}")
        check_pacing(None, speedup)
        self.graph = graph
        nodes = graph.nodes
        # As the reference: not_before times count from the earliest of any node, and they
        # and every dependency delay are divided by the arrival speed-up.
        origin = min(node.not_before_ms for node in nodes)
        self._not_before = [(node.not_before_ms - origin) / speedup for node in nodes]
        self._speedup = speedup
        self._children: list[list[tuple[int, Dependency]]] = [[] for _ in nodes]
        for i, node in enumerate(nodes):
            for dep in node.dependencies:
                self._children[dep.parent].append((i, dep))
        self._waiting = [len(node.dependencies) for node in nodes]
        self._ready_at = [-math.inf] * len(nodes)
        self._play_of: list[int] = [0] * len(nodes)
        plays = graph.plays
        self._play_ids = list(plays)
        self.plays = [_Play(ids, len(ids)) for ids in plays.values()]
        for p, ids in enumerate(plays.values()):
            for i in ids:
                self._play_of[i] = p
        self._heap: list[tuple[float, int]] = []
        self.ready_ms = math.inf  # the heap's first ready time
        self._became_ready = 0
        self._dispatched = 0
        self._lanes = lanes
        self._queued: deque[int] = deque()
        self._remaining = len(nodes)
        if lanes is None:
            for p in range(len(self.plays)):
                roots = self._roots(p)
                self.plays[p].start_ms = min(self._not_before[i] for i in roots)
                for i in roots:
                    self._push(self._not_before[i], i)
        else:
            order = sorted(range(len(self.plays)), key=lambda p: self._play_ids[p])
            self._queued.extend(order)
            for lane in range(min(lanes, len(order))):
                self._start_play(self._queued.popleft(), 0.0, lane)

    def _roots(self, play: int) -> list[int]:
        return [i for i in self.plays[play].nodes if not self.graph.nodes[i].dependencies]

    def _start_play(self, play: int, now: float, lane: int) -> None:
        state = self.plays[play]
        state.start_ms, state.lane = now, lane
        for i in state.nodes:  # the reference reports the lane with each request
            agentic = self.graph.nodes[i].spec.agentic
            if agentic is not None:
                agentic["lane_id"] = f"lane:{lane}"
        for i in self._roots(play):
            self._push(now, i)

    def _push(self, ready: float, node: int) -> None:
        self._became_ready += 1
        heapq.heappush(self._heap, (ready, node))
        self.ready_ms = self._heap[0][0]

    def release(self, now: float) -> list[Released]:
        """Nodes ready at or before ``now``; their dispatch dependents are scheduled."""
        out = []
        heap, nodes = self._heap, self.graph.nodes
        while heap and heap[0][0] <= now:
            _, i = heapq.heappop(heap)
            out.append(Released(nodes[i].spec, i, now))
            self._dispatched += 1
            self._met(i, Trigger.DISPATCH, now)
        self.ready_ms = heap[0][0] if heap else math.inf
        return out

    def on_finished(self, released: Released, now: float) -> None:
        """A node completed or was rejected: its completion dependents may become ready."""
        i = released.session
        self._met(i, Trigger.COMPLETION, now)
        self._remaining -= 1
        play = self.plays[self._play_of[i]]
        play.left -= 1
        if play.left == 0:
            play.end_ms = now
            if self._queued:
                assert play.lane is not None
                self._start_play(self._queued.popleft(), now, play.lane)

    def _met(self, parent: int, trigger: Trigger, now: float) -> None:
        for child, dep in self._children[parent]:
            if dep.trigger is not trigger:
                continue
            at = now + dep.delay_ms / self._speedup
            if at > self._ready_at[child]:
                self._ready_at[child] = at
            self._waiting[child] -= 1
            if self._waiting[child] == 0:
                ready = self._ready_at[child]
                if self._lanes is None:
                    ready = max(ready, self._not_before[child])
                self._push(ready, child)

    def drained(self) -> bool:
        """Every node has ended."""
        return self._remaining == 0

    def play_outcomes(self) -> list[dict[str, Any]]:
        """Each play's end (the report's ``agentic_play_outcomes``), in string order of play id."""
        out = []
        for play_id, play in sorted(zip(self._play_ids, self.plays, strict=True)):
            done = play.end_ms is not None
            out.append(
                {
                    "causal_terminal_ms": play.end_ms,
                    "play_id": play_id,
                    "settled_at_ms": play.end_ms,
                    "status": "completed" if done else "incomplete",
                }
            )
        return out

    def lifecycle_event_count(self) -> int:
        """Lifecycle events so far: each node's ready, dispatch and end, and each play's end."""
        ended = len(self.graph.nodes) - self._remaining
        return (
            self._became_ready
            + self._dispatched
            + ended
            + sum(1 for p in self.plays if p.end_ms is not None)
        )

    def trajectory_latencies(self) -> list[float]:
        """End-to-end latency of each completed play, in play order."""
        return [
            p.end_ms - p.start_ms
            for p in self.plays
            if p.end_ms is not None and p.start_ms is not None
        ]
