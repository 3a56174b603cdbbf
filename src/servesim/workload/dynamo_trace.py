"""Dynamo request traces (``--trace-format dynamo``): ``dynamo.request.trace.v1`` records.

A trace is one or more JSONL shards (gzip or not). Records of another schema
(such as ``request_payload`` lines) are skipped. A ``request_end`` record is
one request::

    {"schema": "dynamo.request.trace.v1", "event_type": "request_end",
     "agent_context": {"session_id": "child", "parent_session_id": "parent"},
     "request": {"request_id": "r0", "output_tokens": 45, "request_received_ms": 1000000,
                 "total_time_ms": 50,
                 "replay": {"trace_block_size": 64, "input_length": 496,
                            "input_sequence_hashes": [100, 101, ...]}}}

Every record carries the trace block size; all must agree (across shards
too), and ``--trace-block-size``, if given, must equal it. A request arrives
at ``request_received_ms``, shifted so that the first is at 0.

A trace whose requests carry ``agent_context`` (all of them: the reference
refuses a mix) is an agentic graph, lowered as the reference lowers it (one
play per root session, named ``dynamo-play:<its first request>``); agent
tool calls (``tool_end`` records whose ``claude`` part names a
``child_session_id``) tie sub-agent sessions to their parents:

- a session's request k waits for request k-1's completion, plus the gap the
  trace shows between k-1's end (received + total time) and k's receipt;
- a child session's first request waits for the dispatch of the tool call's
  source request, plus the gap between their receipts;
- the tool call's consumer request also joins the child session's last
  request: it waits for its completion plus the gap to the consumer's receipt.

Otherwise (no agent context at all) every request replays on its own, as a
one-turn Mooncake row.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesim.errors import TraceError
from servesim.workload.agentic import AgenticGraph, Node, Trigger, build_graph
from servesim.workload.mooncake import Interner, json_lines, label
from servesim.workload.request import BlockContentCache, RequestSpec, Session, TracePrompt

SCHEMA = "dynamo.request.trace.v1"


@dataclass(slots=True)
class _Request:
    request_id: str
    session: str | None
    parent_session: str | None
    received_ms: float
    end_ms: float
    output: int
    input_length: int
    hashes: list[int]
    block_size: int
    where: str


@dataclass(slots=True)
class _Tool:
    source: str
    consumer: str | None
    child_session: str
    where: str


@dataclass(slots=True)
class DynamoTrace:
    """What the shards hold: their requests (in arrival order), tool calls and block size."""

    requests: list[_Request]
    tools: list[_Tool]
    block_size: int

    @property
    def agentic(self) -> bool:
        """Whether agent context makes this trace a graph (every request has one, or none)."""
        return bool(self.tools) or any(r.session is not None for r in self.requests)


def read_dynamo(paths: list[Path], *, trace_block_size: int | None) -> DynamoTrace:
    """Read the shards' records.

    Raises:
        TraceError: a malformed record, block sizes that disagree (between
            records, shards, or with ``trace_block_size``), or no request.
    """
    requests: list[_Request] = []
    tools: list[_Tool] = []
    block_size: int | None = None
    first_where = ""
    for path in paths:
        for where, _, obj in json_lines(path):
            if not isinstance(obj, dict) or obj.get("schema") != SCHEMA:
                continue
            kind = obj.get("event_type")
            if kind == "request_end":
                request = _request(obj, where)
                if block_size is None:
                    block_size, first_where = request.block_size, where
                elif request.block_size != block_size:
                    raise TraceError(
                        f"{where}: trace block size {request.block_size} differs from "
                        f"{block_size} at {first_where} (all shards must share one)"
                    )
                requests.append(request)
            elif kind == "tool_end":
                tool = _tool(obj, where)
                if tool is not None:
                    tools.append(tool)
    if block_size is None:
        raise TraceError(
            f"trace {', '.join(label(p) for p in paths)} did not contain any "
            f"{SCHEMA} request_end record"
        )
    if trace_block_size is not None and trace_block_size != block_size:
        raise TraceError(
            f"trace_block_size {trace_block_size} does not match embedded Dynamo request "
            f"trace block size {block_size} ({first_where})"
        )
    with_context = [r for r in requests if r.session is not None]
    if with_context and len(with_context) < len(requests):
        without = next(r for r in requests if r.session is None)
        raise TraceError(
            f"{without.where}: Dynamo request trace cannot mix requests with and without "
            f"agent_context (this one has none; {with_context[0].where} has one)"
        )
    requests.sort(key=lambda r: r.received_ms)  # stable: shards and lines break ties
    return DynamoTrace(requests, tools, block_size)


def _get(obj: Any, key: str, where: str, what: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise TraceError(f"{where}: missing required field '{what}'")
    return obj[key]


def _number(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TraceError(f"{where}: '{what}' must be a finite number, got {value!r}")
    return float(value)


def _count(value: Any, what: str, where: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(f"{where}: '{what}' must be a non-negative integer, got {value!r}")
    return value


def _request(obj: dict[str, Any], where: str) -> _Request:
    request = _get(obj, "request", where, "request")
    replay = _get(request, "replay", where, "request.replay")
    block_size = _count(
        _get(replay, "trace_block_size", where, "request.replay.trace_block_size"),
        "request.replay.trace_block_size",
        where,
    )
    if block_size < 1:
        raise TraceError(f"{where}: 'request.replay.trace_block_size' must be positive")
    hashes = _get(replay, "input_sequence_hashes", where, "request.replay.input_sequence_hashes")
    if not isinstance(hashes, list) or not hashes:
        raise TraceError(
            f"{where}: 'request.replay.input_sequence_hashes' must be a non-empty list"
        )
    for h in hashes:
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise TraceError(
                f"{where}: 'request.replay.input_sequence_hashes' must hold non-negative integers, found {h!r}"
            )
    input_length = _count(
        replay.get("input_length", len(hashes) * block_size), "request.replay.input_length", where
    )
    if not 1 <= input_length <= len(hashes) * block_size:
        raise TraceError(
            f"{where}: input_length {input_length} must be between 1 and the hashes' capacity "
            f"{len(hashes) * block_size}"
        )
    received = _number(
        _get(request, "request_received_ms", where, "request.request_received_ms"),
        "request.request_received_ms",
        where,
    )
    total = _number(request.get("total_time_ms", 0), "request.total_time_ms", where)
    context = obj.get("agent_context") or {}
    session = context.get("session_id") if isinstance(context, dict) else None
    parent = context.get("parent_session_id") if isinstance(context, dict) else None
    request_id = request.get("request_id")
    return _Request(
        request_id=str(request_id) if request_id is not None else where,
        session=None if session is None else str(session),
        parent_session=None if parent is None else str(parent),
        received_ms=received,
        end_ms=received + total,
        output=_count(
            _get(request, "output_tokens", where, "request.output_tokens"),
            "request.output_tokens",
            where,
        ),
        input_length=input_length,
        hashes=hashes,
        block_size=block_size,
        where=where,
    )


def _tool(obj: dict[str, Any], where: str) -> _Tool | None:
    tool = obj.get("tool")
    claude = tool.get("claude") if isinstance(tool, dict) else None
    if not isinstance(claude, dict) or claude.get("child_session_id") is None:
        return None  # a tool call that starts no sub-agent joins nothing
    source = claude.get("source_request_id")
    if source is None:
        raise TraceError(f"{where}: agent tool call without 'tool.claude.source_request_id'")
    consumer = claude.get("consumer_request_id")
    return _Tool(
        source=str(source),
        consumer=None if consumer is None else str(consumer),
        child_session=str(claude["child_session_id"]),
        where=where,
    )


def _spec(r: _Request, interner: Interner, cache: BlockContentCache) -> RequestSpec:
    used = r.hashes[: -(-r.input_length // r.block_size)]
    return RequestSpec(
        prompt=TracePrompt(interner.tokens(used), r.block_size, r.input_length, cache),
        output_length=r.output,
        request_id=r.request_id,
    )


def dynamo_sessions(trace: DynamoTrace) -> list[Session]:
    """The requests of a trace without agent context, each a one-turn Mooncake session."""
    assert not trace.agentic
    interner, cache = Interner(), BlockContentCache()
    origin = trace.requests[0].received_ms
    out: list[Session] = []
    for r in trace.requests:
        spec = _spec(r, interner, cache)
        spec.affinity_key = r.request_id
        out.append(Session(turns=[spec], start_ms=r.received_ms - origin))
    return out


def dynamo_graph(trace: DynamoTrace) -> AgenticGraph:
    """The agentic graph of a trace with agent tool calls.

    Raises:
        TraceError: a tool call naming a request or session the trace lacks.
    """
    interner, cache = Interner(), BlockContentCache()
    origin = trace.requests[0].received_ms
    by_id = {r.request_id: r for r in trace.requests}
    by_session: dict[str, list[_Request]] = {}
    for r in trace.requests:
        by_session.setdefault(r.session or r.request_id, []).append(r)
    deps: dict[str, list[tuple[str, Trigger, float, str]]] = {
        r.request_id: [] for r in trace.requests
    }
    parent_of_session: dict[str, str] = {}
    for requests in by_session.values():
        for prev, r in itertools.pairwise(requests):
            gap = max(0.0, r.received_ms - prev.end_ms)
            deps[r.request_id].append((prev.request_id, Trigger.COMPLETION, gap, "sequence"))
    for tool in trace.tools:
        source = by_id.get(tool.source)
        child = by_session.get(tool.child_session)
        if source is None or child is None:
            missing = (
                f"request '{tool.source}'" if source is None else f"session '{tool.child_session}'"
            )
            raise TraceError(
                f"{tool.where}: agent tool call names {missing}, which the trace lacks"
            )
        first, last = child[0], child[-1]
        gap = max(0.0, first.received_ms - source.received_ms)
        deps[first.request_id].append((source.request_id, Trigger.DISPATCH, gap, "spawn"))
        parent_of_session[tool.child_session] = source.request_id
        # Whatever its execution_mode (blocking or background), the reference joins the
        # consumer to the sub-agent (probed).
        if tool.consumer is not None:
            consumer = by_id.get(tool.consumer)
            if consumer is None:
                raise TraceError(
                    f"{tool.where}: agent tool call names request '{tool.consumer}', which the trace lacks"
                )
            gap = max(0.0, consumer.received_ms - last.end_ms)
            deps[consumer.request_id].append((last.request_id, Trigger.COMPLETION, gap, "join"))
    play_of = _plays(by_session, parent_of_session, by_id)
    nodes, parents = [], []
    for r in trace.requests:
        spec = _spec(r, interner, cache)
        session = r.session or r.request_id
        spec.session_id = spec.affinity_key = session
        spec.trajectory = play_of[session]
        roots = not deps[r.request_id]
        nodes.append(
            Node(
                request_id=r.request_id,
                play_id=play_of[session],
                spec=spec,
                not_before_ms=r.received_ms - origin if roots else 0.0,
                where=r.where,
            )
        )
        parents.append(deps[r.request_id])
    return build_graph(
        nodes,
        parents,
        block_size=trace.block_size,
        source={
            "digest": f"requests:{len(trace.requests)};tools:{len(trace.tools)}",
            "format": SCHEMA,
        },
        source_models=["unknown"],
    )


def _plays(
    by_session: dict[str, list[_Request]],
    parent_of_session: dict[str, str],
    by_id: dict[str, _Request],
) -> dict[str, str]:
    """Each session's play: ``dynamo-play:<first request of its root session>``."""
    out: dict[str, str] = {}
    for session in by_session:
        root, seen = session, {session}
        while root in parent_of_session:
            parent = by_id[parent_of_session[root]]
            root = parent.session or parent.request_id
            if root in seen:
                break
            seen.add(root)
        out[session] = f"dynamo-play:{by_session[root][0].request_id}"
    return out
