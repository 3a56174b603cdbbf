"""Replaying a one-turn Mooncake trace as a stream, so memory follows the requests in flight.

A Mooncake trace of independent requests (no ``session_id``) whose
timestamps never go back (or any such trace in closed loop) needs no
whole-file view: requests are read from the file as the virtual clock
reaches them. :func:`stream_plan` checks that in a first pass over the file
(reading nothing into memory); :class:`StreamQueue` then releases requests as
the loop asks, reading the file a second time, a row at a time.

What the stream gives up, and why results do not change:

- no look-ahead at which blocks another request shares
  (:mod:`servesim.workload.sharing`): every block is cached under its hash,
  which is slower but replays the same;
- hash ids are not interned to dense tokens (the interner would grow with
  every id of the file): a hash id is its own token, which keeps "same id,
  same block"; so ids must stay below 2^31 (larger ones fall back to the
  whole-file path);
- the block-content cache is emptied whenever it grows past
  :data:`CACHE_ENTRIES` (it only saves recomputing hashes).

Anything else (sessions, a timestamp that goes back, stdin, a bad row) takes
the whole-file path, which reports problems as usual.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesim.errors import TraceError
from servesim.workload.admission import Released, check_pacing
from servesim.workload.mooncake import STDIN, json_lines, label, open_trace, parse_row, read_lines
from servesim.workload.request import OUTPUT_TOKEN_BASE, BlockContentCache

CACHE_ENTRIES = 1 << 15
"""The block-content cache is emptied above this many entries."""


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """A trace that can be streamed: its path, and its first timestamp (the origin)."""

    path: Path
    origin_ms: float
    rows: int


def stream_plan(path: Path, *, closed_loop: bool) -> StreamPlan | None:
    """A first pass over the trace: a plan if it can be streamed, else None."""
    if path == STDIN:
        return None
    origin: float | None = None
    last = -math.inf
    rows = 0
    try:
        with open_trace(path) as handle:
            for _, text in read_lines(handle, label(path)):
                if not text.strip():
                    continue
                obj = json.loads(text)
                if not _one_turn(obj):
                    return None
                ts = obj.get("timestamp", obj.get("created_time"))
                if not closed_loop:
                    if not _finite(ts) or ts < last:
                        return None
                    last = ts
                if origin is None and _finite(ts):
                    origin = float(ts)
                rows += 1
    except (TraceError, ValueError):
        return None  # the whole-file path reports it
    if rows == 0 or (origin is None and not closed_loop):
        return None
    return StreamPlan(path, origin or 0.0, rows)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _one_turn(obj: Any) -> bool:
    if not isinstance(obj, dict) or obj.get("session_id") is not None:
        return False
    ids = obj.get("hash_ids")
    return isinstance(ids, list) and all(
        isinstance(h, int) and not isinstance(h, bool) and 0 <= h < OUTPUT_TOKEN_BASE for h in ids
    )


class _IdentityTokens:
    """A hash id is its own token (see the module docstring)."""

    __slots__ = ()

    def tokens(self, hash_ids: list[int]) -> tuple[int, ...]:
        """The ids themselves."""
        return tuple(hash_ids)


class StreamQueue:
    """Releases a streamed trace's requests as they come due (the admission of streamed runs).

    Open loop: a request arrives at ``(timestamp - origin) / speedup``.
    Closed loop (``concurrency``): up to N requests in flight, each refilled
    at the moment one ends (a one-turn session holds its slot for one turn).
    """

    def __init__(
        self,
        plan: StreamPlan,
        *,
        trace_block_size: int,
        concurrency: int | None = None,
        speedup: float = 1.0,
    ) -> None:
        check_pacing(concurrency, speedup)
        self._plan = plan
        self._concurrency = concurrency
        self._speedup = speedup
        self._cache = BlockContentCache()
        self._rows = self._read(trace_block_size)
        self._head = next(self._rows, None)
        self._in_flight = 0
        self._released = 0
        self.ready_ms = self._next_ready()

    def _read(self, tbs: int) -> Iterator[tuple[float | None, Any]]:
        path, cache, tokens = self._plan.path, self._cache, _IdentityTokens()
        for where, line_no, obj in json_lines(path):
            row = parse_row(obj, where, line_no, tbs, tokens, cache)
            if row.delay:
                raise TraceError(
                    f"{where}: sets delay on the first turn of session request_{line_no}"
                )
            row.spec.affinity_key = f"request_{line_no}"
            if cache.size() > CACHE_ENTRIES:
                cache.clear()
            yield row.timestamp, row.spec

    def _due(self, timestamp: float | None) -> float:
        assert timestamp is not None
        return (timestamp - self._plan.origin_ms) / self._speedup

    def _next_ready(self) -> float:
        """What ``ready_ms`` is now: when the next request can be released (-inf: a slot
        is free)."""
        if self._head is None:
            return math.inf
        if self._concurrency is not None:
            return -math.inf if self._in_flight < self._concurrency else math.inf
        return self._due(self._head[0])

    def release(self, now: float) -> list[Released]:
        """Requests due at or before ``now``, in file order."""
        out = []
        while self._head is not None and self.ready_ms <= now:
            out.append(Released(self._head[1], self._released, now))
            self._released += 1
            self._in_flight += 1
            self._head = next(self._rows, None)
            self.ready_ms = self._next_ready()
        return out

    def on_finished(self, released: Released, now: float) -> None:
        """A request ended: its closed-loop slot frees."""
        self._in_flight -= 1
        self.ready_ms = self._next_ready()

    def drained(self) -> bool:
        """The file is read to its end and every request has ended."""
        return self._head is None and self._in_flight == 0
