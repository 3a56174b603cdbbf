"""Mooncake JSONL traces: one request per line, prompts described by block hash ids.

Fields (aliases in brackets): ``timestamp`` [``created_time``] ms,
``input_length`` [``input_tokens``], ``output_length`` [``output_tokens``]
(required), ``hash_ids`` (required, non-empty), ``session_id``, ``delay``
[``delay_ms``], ``priority``. Unknown fields are ignored. Each hash id stands
for ``trace_block_size`` copies of one token; a hash id gets a dense token id
in order of first appearance, so equal ids mean equal blocks.

Rows sharing a ``session_id`` are the turns of one session, in file order;
a row without one is a one-turn session named ``request_<line>``.

A trace compressed with gzip (known by its magic bytes, whatever its name) is
decompressed as it is read; the path ``-`` reads the trace from stdin. The
file is read as a stream, line by line, in either case.
"""

from __future__ import annotations

import io
import json
import math
import sys
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servesim.errors import TraceError
from servesim.workload.request import BlockContentCache, RequestSpec, Session, TracePrompt


@dataclass(slots=True)
class _Row:
    line: int
    spec: RequestSpec
    timestamp: float | None
    delay: float | None


class Interner:
    """Dense token ids for hash ids, in order of first appearance."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: dict[int, int] = {}

    def tokens(self, hash_ids: list[int]) -> tuple[int, ...]:
        """The tokens of ``hash_ids``, new ids numbered as they come."""
        ids = self._ids
        return tuple([ids.setdefault(h, len(ids)) for h in hash_ids])  # a list: 2x a generator


_INT_ONLY = {int}


def _field(obj: dict[str, Any], *names: str) -> Any:
    for name in names:
        if name in obj:
            return obj[name]
    return None


def _number(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TraceError(f"{where}: {what} must be a finite number, got {value!r}")
    return float(value)


def _count(value: Any, what: str, where: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"{where}: {what} must be a non-negative integer, got {value!r}")
    if value < 0:
        raise TraceError(f"{where}: {what} must be a non-negative integer, got {value}")
    return value


class TokenMap(Protocol):
    """How hash ids become tokens (see :class:`Interner`)."""

    def tokens(self, hash_ids: list[int]) -> tuple[int, ...]:
        """The tokens of ``hash_ids``."""
        ...


def parse_row(
    obj: Any,
    where: str,
    line: int,
    trace_block_size: int,
    interner: TokenMap,
    cache: BlockContentCache,
) -> _Row:
    """One trace row, checked: its request, timestamp and delay.

    Raises:
        TraceError: naming ``where`` and the field at fault.
    """
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    hash_ids = obj.get("hash_ids")
    if hash_ids is None:
        raise TraceError(f"{where}: missing required field 'hash_ids'")
    if not isinstance(hash_ids, list) or not hash_ids:
        raise TraceError(f"{where}: 'hash_ids' must be a non-empty list of integers")
    # The types of all ids at once (a tenth of testing them one by one): a bool is no int here.
    if set(map(type, hash_ids)) != _INT_ONLY or min(hash_ids) < 0:
        bad = next(h for h in hash_ids if type(h) is not int or h < 0)
        raise TraceError(f"{where}: 'hash_ids' must hold non-negative integers, found {bad!r}")
    output = _field(obj, "output_length", "output_tokens")
    if output is None:
        raise TraceError(f"{where}: missing required field 'output_length'")
    output_length = _count(output, "'output_length'", where)
    capacity = len(hash_ids) * trace_block_size
    raw_input = _field(obj, "input_length", "input_tokens")
    input_length = capacity if raw_input is None else _count(raw_input, "'input_length'", where)
    if input_length == 0:
        raise TraceError(f"{where}: 'input_length' must be positive")
    if input_length > capacity:
        raise TraceError(
            f"{where}: input_length {input_length} exceeds hash_ids capacity {capacity} "
            f"({len(hash_ids)} ids x trace block size {trace_block_size})"
        )
    raw_ts = _field(obj, "timestamp", "created_time")
    timestamp = None if raw_ts is None else _number(raw_ts, "'timestamp'", where)
    raw_delay = _field(obj, "delay", "delay_ms")
    delay = None if raw_delay is None else _number(raw_delay, "'delay'", where)
    if delay is not None and delay < 0:
        raise TraceError(f"{where}: 'delay' must be non-negative, got {delay}")
    session = obj.get("session_id")
    if session is not None and not isinstance(session, (str, int)):
        raise TraceError(f"{where}: 'session_id' must be a string or an integer, got {session!r}")
    priority = obj.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TraceError(f"{where}: 'priority' must be an integer, got {priority!r}")
    # Only the ids the prompt covers matter; later ids are unused.
    used = hash_ids[: -(-input_length // trace_block_size)]
    prompt = TracePrompt(interner.tokens(used), trace_block_size, input_length, cache)
    spec = RequestSpec(
        prompt=prompt,
        output_length=output_length,
        session_id=str(session) if session is not None else None,
        priority=priority,
    )
    return _Row(line, spec, timestamp, delay)


STDIN = Path("-")
"""The trace path that reads stdin."""

_GZIP_MAGIC = b"\x1f\x8b"
_EXPECTED = (
    "expected a Mooncake JSONL trace: one JSON object per line, such as "
    '{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}'
)


def label(path: Path) -> str:
    """How messages name the trace."""
    return "<stdin>" if path == STDIN else str(path)


@contextmanager
def open_trace(path: Path) -> Iterator[io.BufferedIOBase]:
    """The trace's bytes: stdin for ``-``, decompressed when they start with gzip's magic."""
    # Not opened in a with: raw is closed by the `with raw` below. Stdin's descriptor is
    # read but left open (closefd=False) for the caller.
    try:
        raw = open(sys.stdin.fileno(), "rb", closefd=False) if path == STDIN else path.open("rb")  # noqa: SIM115
    except OSError as exc:
        raise TraceError(f"cannot open trace file {label(path)}: {exc.strerror}") from None
    with raw:
        if raw.peek(len(_GZIP_MAGIC))[: len(_GZIP_MAGIC)] != _GZIP_MAGIC:
            yield raw
            return
        import gzip  # (only a compressed trace needs it)

        with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:  # leaves raw open: closed above
            yield unzipped


def _read_rows(path: Path, trace_block_size: int, cache: BlockContentCache) -> Iterator[_Row]:
    interner = Interner()
    for where, line_no, obj in json_lines(path, lambda where, text, _: _not_jsonl(where, text)):
        yield parse_row(obj, where, line_no, trace_block_size, interner, cache)


def _not_jsonl(where: str, text: str) -> str:
    """The message for a trace whose first line is not JSON: most likely another format."""
    line = text.strip()
    shown = line if len(line) <= 60 else line[:57] + "..."
    kind = "looks like CSV" if "," in line and line[0] not in "{[" else "is not JSON"
    return f"{where}: not a Mooncake trace: this line {kind} ({shown!r}); {_EXPECTED}"


def json_lines(
    path: Path, first_error: Callable[[str, str, json.JSONDecodeError], str] | None = None
) -> Iterator[tuple[str, int, Any]]:
    """Each non-blank line of a JSONL trace, parsed, with where it is (``file:line``) and
    its number.

    Raises:
        TraceError: a line is not JSON (``first_error(where, text, error)`` words the
            message for the first line, most likely a file of another format).
    """
    name = label(path)
    first = True
    with open_trace(path) as handle:
        for line_no, text in read_lines(handle, name):
            if not text.strip():
                continue
            where = f"{name}:{line_no}"
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                if first and first_error is not None:
                    raise TraceError(first_error(where, text, exc)) from None
                raise TraceError(
                    f"{where}: invalid JSON ({exc.msg} at column {exc.colno})"
                ) from None
            first = False
            yield where, line_no, obj


def read_lines(handle: io.BufferedIOBase, label: str) -> Iterator[tuple[int, str]]:
    """Each line as text, with its 1-based number; each is decoded alone, so a bad byte is
    reported on its own line."""
    line_no = 0
    try:
        for line_no, data in enumerate(handle, start=1):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                if line_no == 1:
                    raise TraceError(f"{label}: not UTF-8 text; {_EXPECTED}") from None
                raise TraceError(f"{label}:{line_no}: not UTF-8 text") from None
            yield line_no, text
    except (OSError, EOFError, zlib.error) as exc:  # damaged or truncated gzip data
        raise TraceError(f"{label}:{line_no + 1}: cannot read the trace: {exc}") from None


def read_mooncake(path: Path, *, trace_block_size: int, need_timestamps: bool) -> list[Session]:
    """Read a Mooncake trace into sessions, in order of first appearance.

    Args:
        path: the JSONL file (gzip-compressed or not), or ``-`` for stdin.
        trace_block_size: tokens per hash id.
        need_timestamps: open-loop replay needs every session's first turn to
            carry a timestamp; closed-loop replay ignores them.

    Raises:
        TraceError: naming the file and line of the first problem found.
    """
    if trace_block_size <= 0:
        raise TraceError(f"trace block size must be greater than 0, got {trace_block_size}")
    cache = BlockContentCache()
    # Keyed apart, so that an explicit session named like an implicit one stays separate.
    sessions: dict[tuple[bool, str], list[_Row]] = {}
    name = label(path)
    for row in _read_rows(path, trace_block_size, cache):
        explicit = row.spec.session_id is not None
        # A row without a session is a one-turn session of its own, named as the reference names it.
        key = row.spec.session_id if explicit else f"request_{row.line}"
        assert key is not None
        row.spec.affinity_key = key
        sessions.setdefault((explicit, key), []).append(row)
    if not sessions:
        raise TraceError(f"trace file {name} did not contain any requests")
    # As the reference reports them: a trace without any session has no session ids or
    # turn numbers (null); in a trace with sessions, a row without one is turn 0 of its own.
    named = any(explicit for explicit, _ in sessions)
    return [
        _session(name, key, rows, need_timestamps, named=named)
        for (_, key), rows in sessions.items()
    ]


def _session(
    path: str, key: str, rows: list[_Row], need_timestamps: bool, *, named: bool
) -> Session:
    first = rows[0]
    where = f"{path}:{first.line}"
    if first.delay:
        raise TraceError(f"{where}: sets delay on the first turn of session {key}")
    if first.timestamp is None and need_timestamps:
        raise TraceError(
            f"{where}: first turn of session {key} has no timestamp (needed for open-loop replay)"
        )
    if first.timestamp is not None and first.timestamp < 0:
        raise TraceError(f"{where}: timestamp must be non-negative, got {first.timestamp}")
    last_ts = first.timestamp
    for k, row in enumerate(rows):
        if named:
            row.spec.session_id = key
            row.spec.turn_index = k
        if k == 0:
            continue
        if row.delay is not None:
            row.spec.delay_ms = row.delay
        elif row.timestamp is not None:
            if last_ts is None:
                raise TraceError(
                    f"{path}:{row.line}: session {key} cannot infer delay without a previous timestamp"
                )
            delay = row.timestamp - last_ts
            if delay < 0:
                raise TraceError(
                    f"{path}:{row.line}: session {key} has a negative delay {delay} (timestamps go back)"
                )
            row.spec.delay_ms = delay
        if row.timestamp is not None:
            last_ts = row.timestamp
    return Session(turns=[r.spec for r in rows], start_ms=first.timestamp)
