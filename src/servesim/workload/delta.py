"""Traces whose turns describe only what each adds: ``mooncake-delta`` and ``applied_compute_agentic``.

Both build a session's prompts as the reference (Dynamo 1.6.1) does: turn
k's prompt is turn k-1's prompt, then turn k-1's output tokens, then turn k's
own segment::

    turn 0   [ segment 0 ]
    turn 1   [ segment 0 ][ output 0 ][ segment 1 ]
    turn 2   [ segment 0 ][ output 0 ][ segment 1 ][ output 1 ][ segment 2 ]

so a later turn can reuse the blocks its previous turn cached, its generated
tokens' blocks included. The output tokens are the workload's: the n-th
request repeats token :func:`~servesim.workload.request.output_token` (n),
and the engine hashes its generated blocks from them (``RequestSpec.sequence``).

``mooncake-delta`` rows are Mooncake rows (same fields, same session and
delay rules) whose ``hash_ids``/``input_length`` are the turn's segment.
``applied_compute_agentic`` lines are whole sessions: ``num_turns``,
``input_prompt_length`` (> 0), ``assistant_response_length``,
``tool_call_output_length`` and ``tool_call_latency`` (seconds; each array
``num_turns`` long) and ``final_assistant_response_length``. Turn 0's
segment is the prompt; turn i (1 ≤ i ≤ num_turns) adds assistant response
i-1 and tool output i-1 and waits ``tool_call_latency[i-1]`` s after turn
i-1 completes; turn i < num_turns emits ``assistant_response_length[i]``
tokens, the last one ``final_assistant_response_length``. Unlike a delta
turn, the assistant response in the next prompt is not the tokens the
engine generated (the reference never reuses a block holding generated
tokens here), so it is a new segment too. Segments are new hash ids of
``trace_block_size`` tokens each, except that with ``shared_prefix_ratio`` and
``num_prefix_groups`` set, the first ``round(blocks x ratio)`` ids of line
i's prompt are those of group ``i mod num_prefix_groups``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from servesim.errors import TraceError
from servesim.workload.mooncake import json_lines, label, read_mooncake
from servesim.workload.request import (
    BlockContentCache,
    RequestSpec,
    RunPrompt,
    Session,
    TracePrompt,
    output_token,
    trace_runs,
)


class _Outputs:
    """Numbers the requests whose output tokens a later prompt repeats."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def runs(self, length: int) -> tuple[tuple[int, int], ...]:
        token = output_token(self.count)
        self.count += 1
        return ((token, length),) if length else ()


def read_mooncake_delta(
    path: Path, *, trace_block_size: int, need_timestamps: bool
) -> list[Session]:
    """Read a ``mooncake-delta`` trace: Mooncake rows whose later turns hold only their new segment.

    Raises:
        TraceError: naming the file and line of the first problem found.
    """
    sessions = read_mooncake(
        path, trace_block_size=trace_block_size, need_timestamps=need_timestamps
    )
    cache = BlockContentCache()
    outputs = _Outputs()
    for session in sessions:
        prompt: RunPrompt | None = None
        for spec in session.turns:
            segment = spec.prompt
            assert isinstance(segment, TracePrompt)
            runs = trace_runs(segment.tokens, segment.trace_block_size, segment.length)
            prompt = RunPrompt(runs, cache) if prompt is None else prompt.then(runs)
            _continue(spec, prompt, outputs)
            prompt = _sequence(spec)
    return sessions


def _sequence(spec: RequestSpec) -> RunPrompt:
    """The prompt-plus-output sequence :func:`_continue` gave ``spec``."""
    assert isinstance(spec.sequence, RunPrompt)
    return spec.sequence


def _continue(spec: RequestSpec, prompt: RunPrompt, outputs: _Outputs) -> None:
    """Give ``spec`` its cumulative prompt and its prompt-plus-output sequence."""
    spec.prompt = prompt
    spec.sequence = prompt.then(outputs.runs(spec.output_length))
    spec.shared_blocks = None  # every block may be hit by the session's next turn


_APPLIED_ARRAYS = ("assistant_response_length", "tool_call_output_length", "tool_call_latency")


def read_applied_compute(
    path: Path,
    *,
    trace_block_size: int,
    shared_prefix_ratio: float = 0.0,
    num_prefix_groups: int = 0,
) -> list[Session]:
    """Read an ``applied_compute_agentic`` trace: one sequential tool-calling session per line.

    The sessions carry no start time: the trace replays in closed loop only.

    Raises:
        TraceError: naming the file and line of the first problem found.
    """
    if not 0.0 <= shared_prefix_ratio <= 1.0:
        raise TraceError(
            f"trace shared prefix ratio must be between 0 and 1, got {shared_prefix_ratio}"
        )
    if num_prefix_groups < 0:
        raise TraceError(f"trace prefix groups must be non-negative, got {num_prefix_groups}")
    cache = BlockContentCache()
    ids = _FreshIds()
    sessions: list[Session] = []
    for where, _, obj in json_lines(path):
        index = len(sessions)
        group = index % num_prefix_groups if num_prefix_groups and shared_prefix_ratio else None
        sessions.append(
            _applied_session(
                obj, where, index, group, shared_prefix_ratio, trace_block_size, ids, cache
            )
        )
    if not sessions:
        raise TraceError(f"trace file {label(path)} did not contain any sessions")
    return sessions


class _FreshIds:
    """Tokens for new segments: one per trace block, never repeated; group prefixes apart."""

    __slots__ = ("_groups", "_next")

    def __init__(self) -> None:
        self._next = 0
        self._groups: dict[tuple[int, int], int] = {}

    def fresh(self, n: int) -> list[int]:
        start = self._next
        self._next += n
        return list(range(start, start + n))

    def group(self, group: int, n: int) -> list[int]:
        out = []
        for j in range(n):
            token = self._groups.get((group, j))
            if token is None:
                token = self._groups[group, j] = self._next
                self._next += 1
            out.append(token)
        return out


def _positive_count(obj: dict[str, Any], key: str, where: str, *, minimum: int) -> int:
    value = obj.get(key)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        bound = "a positive" if minimum > 0 else "a non-negative"
        raise TraceError(f"{where}: '{key}' must be {bound} integer, got {value!r}")
    return value


def _applied_session(
    obj: Any,
    where: str,
    index: int,
    group: int | None,
    ratio: float,
    tbs: int,
    ids: _FreshIds,
    cache: BlockContentCache,
) -> Session:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    num_turns = _positive_count(obj, "num_turns", where, minimum=0)
    prompt_length = _positive_count(obj, "input_prompt_length", where, minimum=1)
    final = _positive_count(obj, "final_assistant_response_length", where, minimum=0)
    arrays: dict[str, list[Any]] = {}
    for key in _APPLIED_ARRAYS:
        value = obj.get(key)
        if not isinstance(value, list) or len(value) != num_turns:
            raise TraceError(
                f"{where}: '{key}' must be a list of num_turns ({num_turns}) values, got {value!r}"
            )
        arrays[key] = value
    latencies = []
    for value in arrays["tool_call_latency"]:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise TraceError(
                f"{where}: 'tool_call_latency' must hold finite non-negative seconds, found {value!r}"
            )
        latencies.append(float(value) * 1000.0)
    lengths = {
        key: [_positive_count({key: v}, key, where, minimum=0) for v in arrays[key]]
        for key in ("assistant_response_length", "tool_call_output_length")
    }
    blocks = -(-prompt_length // tbs)
    shared = 0 if group is None else min(blocks, _round_half_away(blocks * ratio))
    tokens = (ids.group(group, shared) if group is not None else []) + ids.fresh(blocks - shared)
    prompt = RunPrompt(trace_runs(tuple(tokens), tbs, prompt_length), cache)
    turns: list[RequestSpec] = []
    session_id = f"applied_compute_agentic_session_{index + 1}"
    for turn in range(num_turns + 1):
        if turn:
            # The assistant's reply as the next prompt repeats it is not what the engine
            # generated (the reference reuses no block holding generated tokens): new tokens.
            for length in (
                lengths["assistant_response_length"][turn - 1],
                lengths["tool_call_output_length"][turn - 1],
            ):
                prompt = prompt.then(trace_runs(tuple(ids.fresh(-(-length // tbs))), tbs, length))
        output = final if turn == num_turns else lengths["assistant_response_length"][turn]
        spec = RequestSpec(
            prompt=prompt,
            output_length=output,
            session_id=session_id,
            turn_index=turn,
            affinity_key=session_id,
            delay_ms=latencies[turn - 1] if turn else 0.0,
        )
        turns.append(spec)
    return Session(turns=turns)


def _round_half_away(x: float) -> int:
    return math.floor(x + 0.5)
