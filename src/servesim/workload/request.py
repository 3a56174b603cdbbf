"""Requests as the workload describes them, and the prompts behind their hashes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servesim.engine.kv.hashing import chain_all, hash_tokens
from servesim.engine.request import Prompt


class BlockContentCache:
    """Local hashes of block contents already seen, so each distinct block is hashed once.

    Trace prompts repeat one token per trace block, so an engine block's content
    is a short run-length key such as ``((token, 64),)``.
    """

    __slots__ = ("_by_size", "_chains", "_hashes", "_uniform")

    def __init__(self) -> None:
        self._hashes: dict[tuple[tuple[int, int], ...], int] = {}
        self._uniform: dict[tuple[int, int], int] = {}
        self._by_size: dict[int, dict[int, int]] = {}  # block size -> token -> uniform hash
        # (sequence hash before a trace block, its token, engine block size) -> the
        # sequence hashes of the engine blocks filling that trace block.
        self._chains: dict[tuple[int | None, int, int], tuple[int, ...]] = {}

    def size(self) -> int:
        """Entries held (a measure of its memory)."""
        return len(self._hashes) + len(self._uniform) + len(self._chains)

    def clear(self) -> None:
        """Forget every entry: they are recomputed as needed (the hashes do not change)."""
        self._hashes.clear()
        self._uniform.clear()
        self._by_size.clear()
        self._chains.clear()

    def uniform_chain(
        self, parent: int | None, token: int, block_size: int, per_block: int
    ) -> tuple[int, ...]:
        """Sequence hashes of ``per_block`` blocks of ``block_size`` copies of ``token`` after ``parent``.

        Prompts that share a trace prefix share these runs: each is chained once.
        """
        key = (parent, token, block_size)
        run = self._chains.get(key)
        if run is None:
            local = self.uniform_hash(token, block_size)
            run = self._chains[key] = tuple(chain_all([local] * per_block, parent))
        return run

    def uniform_hash(self, token: int, count: int) -> int:
        """Hash of a block of ``count`` copies of one token (the common trace case)."""
        key = (token, count)
        h = self._uniform.get(key)
        if h is None:
            h = self._uniform[key] = hash_tokens(token.to_bytes(4, "little") * count)
            self.uniform_hashes(count)[token] = h
        return h

    def uniform_hashes(self, count: int) -> dict[int, int]:
        """The uniform hashes known for blocks of ``count`` tokens, by token (read-only to callers)."""
        known = self._by_size.get(count)
        if known is None:
            known = self._by_size[count] = {}
        return known

    def local_hash(self, runs: tuple[tuple[int, int], ...]) -> int:
        """Hash of a block made of ``count`` copies of each ``token``, in order."""
        h = self._hashes.get(runs)
        if h is None:
            data = b"".join(int(token).to_bytes(4, "little") * count for token, count in runs)
            h = self._hashes[runs] = hash_tokens(data)
        return h


class TracePrompt:
    """A trace prompt: ``trace_block_size`` copies of one token per hash id, cut to ``length``."""

    __slots__ = ("_cache", "length", "tokens", "trace_block_size")

    def __init__(
        self, tokens: tuple[int, ...], trace_block_size: int, length: int, cache: BlockContentCache
    ) -> None:
        self.tokens = tokens
        self.trace_block_size = trace_block_size
        self.length = length
        self._cache = cache

    def block_hashes(self, block_size: int, count: int) -> list[int]:
        """See :class:`~servesim.engine.request.Prompt`."""
        tbs, tokens, local_hash = self.trace_block_size, self.tokens, self._cache.local_hash
        num_blocks = min(self.length // block_size, count)
        if tbs % block_size == 0:
            # Each engine block lies inside one trace block: one run of one token.
            per_id = tbs // block_size
            uniform_hash = self._cache.uniform_hash
            known = self._cache.uniform_hashes(block_size)
            out = []
            for token in tokens[: -(-num_blocks // per_id)]:
                h = known.get(token)
                out += [uniform_hash(token, block_size) if h is None else h] * per_id
            return out[:num_blocks]
        out = []
        for j in range(num_blocks):
            start, end = j * block_size, (j + 1) * block_size
            runs = []
            pos = start
            while pos < end:
                index = pos // tbs
                stop = min(end, (index + 1) * tbs)
                runs.append((tokens[index], stop - pos))
                pos = stop
            out.append(local_hash(tuple(runs)))
        return out

    def sequence_hashes(self, block_size: int, count: int) -> list[int]:
        """See :class:`~servesim.engine.request.Prompt`."""
        tbs = self.trace_block_size
        if tbs % block_size:
            return chain_all(self.block_hashes(block_size, count))
        num_blocks = min(self.length // block_size, count)
        per_id = tbs // block_size
        chain = self._cache.uniform_chain
        out: list[int] = []
        parent = None
        for token in self.tokens[: -(-num_blocks // per_id)]:
            run = chain(parent, token, block_size, per_id)
            out += run
            parent = run[-1]
        del out[num_blocks:]
        return out


class RunPrompt:
    """A prompt given as runs of one repeated token: ``((token, count), ...)``.

    Prompts that grow turn by turn (a delta turn appends the previous turn's
    output and its own segment to the previous prompt) are such runs: a trace
    segment is one run per hash id, an output one run of the request's own
    output token (see :func:`output_token`).
    """

    __slots__ = ("_cache", "length", "runs")

    def __init__(self, runs: tuple[tuple[int, int], ...], cache: BlockContentCache) -> None:
        self.runs = runs
        self.length = sum(count for _, count in runs)
        self._cache = cache

    def then(self, runs: tuple[tuple[int, int], ...]) -> RunPrompt:
        """This prompt followed by ``runs``."""
        return RunPrompt(self.runs + runs, self._cache)

    def block_hashes(self, block_size: int, count: int) -> list[int]:
        """See :class:`~servesim.engine.request.Prompt`."""
        num_blocks = min(self.length // block_size, count)
        out: list[int] = []
        block: list[tuple[int, int]] = []
        room = block_size
        local_hash = self._cache.local_hash
        for token, run in self.runs:
            while run and len(out) < num_blocks:
                take = min(run, room)
                block.append((token, take))
                run -= take
                room -= take
                if room == 0:
                    out.append(local_hash(tuple(block)))
                    block, room = [], block_size
            if len(out) == num_blocks:
                break
        return out

    def sequence_hashes(self, block_size: int, count: int) -> list[int]:
        """See :class:`~servesim.engine.request.Prompt`."""
        return chain_all(self.block_hashes(block_size, count))


OUTPUT_TOKEN_BASE = 1 << 31
"""Output tokens a workload knows are ``OUTPUT_TOKEN_BASE + n`` for the n-th such request,
apart from every trace token (dense ids from 0)."""


def output_token(n: int) -> int:
    """The token the n-th request with known output repeats as its output."""
    return OUTPUT_TOKEN_BASE + n


def trace_runs(
    tokens: tuple[int, ...], trace_block_size: int, length: int
) -> tuple[tuple[int, int], ...]:
    """Runs of a trace segment: ``trace_block_size`` copies of each token, cut to ``length``."""
    runs = []
    left = length
    for token in tokens:
        if left <= 0:
            break
        take = min(trace_block_size, left)
        runs.append((token, take))
        left -= take
    return tuple(runs)


_MASK = np.uint64(0xFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class SyntheticPrompt:
    """Unique tokens: token i of request r is a SplitMix64 hash of (r, i), 0 remapped to 1."""

    __slots__ = ("index", "length")

    def __init__(self, index: int, length: int) -> None:
        self.index = index
        self.length = length

    def block_hashes(self, block_size: int, count: int) -> list[int]:
        """See :class:`~servesim.engine.request.Prompt`."""
        n = min(self.length // block_size, count) * block_size
        positions = np.arange(n, dtype=np.uint64) + np.uint64(self.index << 32)
        tokens = (_splitmix64(positions) & _MASK).astype("<u4")
        tokens[tokens == 0] = 1
        data = tokens.tobytes()
        step = block_size * 4
        return [hash_tokens(data[i : i + step]) for i in range(0, len(data), step)]

    def sequence_hashes(self, block_size: int, count: int) -> list[int]:
        """See :class:`~servesim.engine.request.Prompt`."""
        return chain_all(self.block_hashes(block_size, count))


@dataclass(slots=True, kw_only=True)
class RequestSpec:
    """One request of the workload.

    Attributes:
        prompt: the prompt tokens (through their block hashes).
        output_length: output tokens requested.
        session_id: the session it belongs to, or None for a one-shot request.
        turn_index: 0-based turn within its session (None for one-shot requests).
        affinity_key: the name session affinity keeps together: the session id, or
            ``request_<line>`` for a trace row without one (as the reference names
            it); None for synthetic requests.
        delay_ms: think time after the previous turn completes (later turns only).
        priority: soft priority hint for router queues.
        shared_blocks: leading full prompt blocks some other request also has
            (see :mod:`servesim.workload.sharing`); None when not worked out.
        prefill_shared_blocks: on a disaggregated run's prefill rank, when the
            rank is known before the replay, those some other request of that
            rank has; None: ``shared_blocks``.
        sequence: the prompt followed by the output tokens, when a later
            prompt repeats them (delta and applied-compute turns); None otherwise.
        request_id: the trace's id of the request, when it names one.
        trajectory: the agentic play (trajectory) it belongs to, if any.
        agentic: its place in an agentic graph as the reference reports it
            (``conversation_id``, ``play_id``, ``request_id``, ``root_id``, and
            ``parent_id`` for a spawned request); None outside one.
    """

    prompt: Prompt
    output_length: int
    session_id: str | None = None
    turn_index: int | None = None
    affinity_key: str | None = None
    delay_ms: float = 0.0
    priority: int = 0
    shared_blocks: int | None = None
    prefill_shared_blocks: int | None = None
    sequence: Prompt | None = None
    request_id: str | None = None
    trajectory: str | None = None
    agentic: dict[str, str] | None = None

    @property
    def input_length(self) -> int:
        """Prompt tokens."""
        return self.prompt.length


@dataclass(slots=True, kw_only=True)
class Session:
    """Turns that run one after another; turn k+1 is ready ``delay`` after turn k completes.

    ``start_ms`` is the first turn's arrival in open-loop replay (None in closed loop).
    """

    turns: list[RequestSpec]
    start_ms: float | None = None
