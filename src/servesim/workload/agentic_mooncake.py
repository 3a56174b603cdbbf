"""Agentic Mooncake v2 traces (``--trace-format agentic_mooncake``): a header, then graph nodes.

Line 1 is the header::

    {"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 64,
     "hash_id_scope": "local", "source": {"format": ..., "digest": ...}}

whose ``block_size`` is the trace block size (``--trace-block-size`` is not
used). Every later line is one request::

    {"request_id": "p0-join", "play_id": "play0", "session_id": "p0-main",
     "model": "source-model", "input_length": 960, "output_length": 70,
     "hash_ids": [...], "not_before_ms": 0,
     "dependencies": [{"request_id": "p0-root", "trigger": "completion",
                       "delay_ms": 0.0, "relation": "sequence"}, ...]}

``trigger`` is ``dispatch`` or ``completion`` (see :mod:`servesim.workload.agentic`).
A v1 file (no header) is refused, as the reference refuses it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from servesim.errors import TraceError
from servesim.workload.agentic import AgenticGraph, Node, Trigger, build_graph
from servesim.workload.mooncake import Interner, json_lines, label
from servesim.workload.request import BlockContentCache, RequestSpec, TracePrompt

SCHEMA = "dynamo.agentic_mooncake"


def _not_a_header(where: str, text: str, error: json.JSONDecodeError) -> str:
    return _header_message(where, f"invalid JSON: {error.msg}")


def read_agentic_mooncake(path: Path) -> AgenticGraph:
    """Read an agentic Mooncake v2 trace into a checked graph.

    Raises:
        TraceError: naming the file and line of the first problem found.
    """
    name = label(path)
    header: dict[str, Any] | None = None
    nodes: list[Node] = []
    parents: list[list[tuple[str, Trigger, float, str]]] = []
    models: set[str] = set()
    interner = Interner()
    cache = BlockContentCache()
    for where, _, obj in json_lines(path, _not_a_header):
        if header is None:
            header = _header(obj, where)
            continue
        node, deps = _node(obj, where, header["block_size"], interner, cache)
        models.add(str(obj.get("model") or "unknown"))
        nodes.append(node)
        parents.append(deps)
    if header is None or not nodes:
        raise TraceError(f"trace file {name} did not contain any requests")
    source = header.get("source")
    return build_graph(
        nodes,
        parents,
        block_size=header["block_size"],
        source=source if isinstance(source, dict) else {},
        source_models=sorted(models),
    )


def _header_message(where: str, problem: str) -> str:
    return (
        f"{where}: failed to parse line 1 as the agentic Mooncake v2 header ({problem}); "
        f'expected {{"schema": "{SCHEMA}", "version": 2, "block_size": N, ...}} '
        "(v1 agentic files without a header are not supported)"
    )


def _header(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or obj.get("schema") != SCHEMA:
        raise TraceError(_header_message(where, f"no 'schema': '{SCHEMA}'"))
    if obj.get("version") != 2:
        raise TraceError(_header_message(where, f"version {obj.get('version')!r}, expected 2"))
    block_size = obj.get("block_size")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise TraceError(
            _header_message(where, f"block_size {block_size!r} is not a positive integer")
        )
    return obj


def _node(
    obj: Any, where: str, tbs: int, interner: Interner, cache: BlockContentCache
) -> tuple[Node, list[tuple[str, Trigger, float, str]]]:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    request_id = obj.get("request_id")
    if not isinstance(request_id, str) or not request_id:
        raise TraceError(f"{where}: 'request_id' must be a non-empty string, got {request_id!r}")
    play_id = obj.get("play_id")
    if not isinstance(play_id, str) or not play_id:
        raise TraceError(f"{where}: 'play_id' must be a non-empty string, got {play_id!r}")
    hash_ids = obj.get("hash_ids")
    if not isinstance(hash_ids, list) or not hash_ids:
        raise TraceError(f"{where}: 'hash_ids' must be a non-empty list of integers")
    for h in hash_ids:
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise TraceError(f"{where}: 'hash_ids' must hold non-negative integers, found {h!r}")
    output = _count(obj.get("output_length"), "output_length", where)
    capacity = len(hash_ids) * tbs
    raw_input = obj.get("input_length")
    input_length = capacity if raw_input is None else _count(raw_input, "input_length", where)
    if input_length < 1 or input_length > capacity:
        raise TraceError(
            f"{where}: input_length {input_length} must be between 1 and the hash_ids capacity {capacity}"
        )
    not_before = _ms(obj.get("not_before_ms", 0), "not_before_ms", where)
    session = obj.get("session_id")
    session_id = str(session) if session is not None else request_id
    priority = obj.get("priority", 0) or 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TraceError(f"{where}: 'priority' must be an integer, got {priority!r}")
    used = hash_ids[: -(-input_length // tbs)]
    spec = RequestSpec(
        prompt=TracePrompt(interner.tokens(used), tbs, input_length, cache),
        output_length=output,
        session_id=session_id,
        affinity_key=session_id,
        priority=priority,
        request_id=request_id,
        trajectory=play_id,
    )
    deps = obj.get("dependencies") or []
    if not isinstance(deps, list):
        raise TraceError(f"{where}: 'dependencies' must be a list, got {deps!r}")
    out = [_dependency(dep, where) for dep in deps]
    return Node(
        request_id=request_id, play_id=play_id, spec=spec, not_before_ms=not_before, where=where
    ), out


def _dependency(dep: Any, where: str) -> tuple[str, Trigger, float, str]:
    if not isinstance(dep, dict) or not isinstance(dep.get("request_id"), str):
        raise TraceError(
            f"{where}: each dependency must be an object with a 'request_id', got {dep!r}"
        )
    trigger = dep.get("trigger", "completion")
    try:
        kind = Trigger(trigger)
    except ValueError:
        raise TraceError(
            f"{where}: dependency trigger must be 'dispatch' or 'completion', got {trigger!r}"
        ) from None
    delay = _ms(dep.get("delay_ms", 0), "delay_ms", where)
    relation = dep.get("relation", "sequence")
    return dep["request_id"], kind, delay, str(relation)


def _count(value: Any, key: str, where: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(f"{where}: '{key}' must be a non-negative integer, got {value!r}")
    return value


def _ms(value: Any, key: str, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise TraceError(f"{where}: '{key}' must be a finite non-negative number, got {value!r}")
    return float(value)
