"""Which prompt blocks another request could ever match (a whole-workload look-ahead).

A cached block is found only by a request whose prompt has the same tokens up
to and including that block. The workload is known before the replay starts,
so for each request we can count its leading full blocks that some *other*
request also has: its *shared* blocks. Only those need a sequence hash and a
place in the pool's hash index; the rest (and every block of generated
tokens) can never be matched by another request, so the pool keeps them
cached but unnamed, and names them only if their owner is preempted (it is
the one request that can match them). The replay is unchanged; the hashing
and index work for blocks nobody can hit is skipped.

When the KV pool each request will use is known before the replay (round
robin over a fixed pool of workers, in a release order that no timing can
change), only requests placed on the same pool can ever match each other's
blocks, and sharing is counted within each pool: round robin over 16 workers
names less than a third as many blocks of the Mooncake conversation trace.

Trace prompts share blocks through their hash ids: engine block j (of size
``bs``) depends on the first ``ceil((j + 1) bs / tbs)`` ids; synthetic sessions'
prompts are trace prompts too (one id per engine block). One-shot synthetic
prompts share nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from servesim.workload.request import RequestSpec, Session, SyntheticPrompt, TracePrompt


def mark_shared_blocks(
    sessions: list[Session],
    block_size: int,
    *,
    pools: Sequence[int] | None = None,
    prefill_pools: Sequence[int] | None = None,
) -> None:
    """Set ``shared_blocks`` on every request of the workload, for engine blocks of ``block_size``.

    Args:
        pools: when known before the replay, the KV pool (DP rank) each request
            will use, request by request in session and turn order; blocks are
            then shared only between requests of the same pool.
        prefill_pools: a disaggregated run's prefill pools, when known before the
            replay (its decode side's are not): ``prefill_shared_blocks`` is then
            set too, counted within them (from the same trie).
    """
    specs = [spec for session in sessions for spec in session.turns]
    for given in (pools, prefill_pools):
        assert given is None or len(given) == len(specs), "one pool per request"
    trace = [(i, spec) for i, spec in enumerate(specs) if isinstance(spec.prompt, TracePrompt)]
    for spec in specs:
        if isinstance(spec.prompt, SyntheticPrompt):
            spec.shared_blocks = 0
    if not trace:
        return
    prompts = [spec.prompt for _, spec in trace if isinstance(spec.prompt, TracePrompt)]
    assert len(prompts) == len(trace)
    trie = _Trie(prompts, block_size)
    for (_, spec), blocks in zip(trace, trie.shared(_pools_of(trace, pools)), strict=True):
        spec.shared_blocks = blocks
    if prefill_pools is not None:
        marks = trie.shared(_pools_of(trace, prefill_pools))
        for (_, spec), blocks in zip(trace, marks, strict=True):
            spec.prefill_shared_blocks = blocks


def _pools_of(
    trace: list[tuple[int, RequestSpec]], pools: Sequence[int] | None
) -> np.ndarray | None:
    """The pool of each trace request (None: one pool for all)."""
    return None if pools is None else np.array([pools[i] for i, _ in trace], dtype=np.int64)


def names_any(sessions: list[Session]) -> bool:
    """Whether :func:`mark_shared_blocks` could name any block of the workload: only trace
    prompts share blocks (so only then does knowing each request's pool narrow anything)."""
    return any(isinstance(spec.prompt, TracePrompt) for s in sessions for spec in s.turns)


class _Trie:
    """The trace prompts' full blocks as a trie of their ids, and the blocks each shares
    (with the other requests of the workload, or of its own pool).

    Node ids are given depth by depth: the prompts still running at depth ``d``
    each extend their node at ``d - 1`` by their ``d``-th token, and equal
    (parent, token) pairs get one node. Each node keeps the largest full-block
    count of the requests through it, who had it (the first in trace order on
    a tie) and the second largest, so "the longest other request through this
    node" is one look-up. A request's blocks are shared up to the first depth
    where that other request is shorter than the blocks the depth covers.
    """

    def __init__(self, prompts: list[TracePrompt], bs: int) -> None:
        self._bs = bs
        self._tbs = tbs = np.array([p.trace_block_size for p in prompts], dtype=np.int64)
        self._full = full = np.array([p.length // bs for p in prompts], dtype=np.int64)
        self._needed = needed = -(-full * bs // tbs)  # ids that full blocks depend on
        tokens = np.fromiter(
            itertools.chain.from_iterable(
                p.tokens[:n] for p, n in zip(prompts, needed.tolist(), strict=True)
            ),
            dtype=np.int64,
        )
        self._starts = starts = np.zeros(len(prompts), dtype=np.int64)
        np.cumsum(needed[:-1], out=starts[1:])
        # Node of each (request, depth) entry, entries request by request, depth ascending.
        self._node = node = np.empty(len(tokens), dtype=np.int64)
        # Tokens renumbered densely, so that (parent, token) keys stay below len(tokens)^2.
        distinct, tokens = np.unique(tokens, return_inverse=True)
        width = len(distinct)
        by_length = np.argsort(-needed, kind="stable")  # the requests running at depth d: a prefix
        # The root is -1 and nodes are numbered from 0, so that the root never meets a node.
        parent = np.full(len(prompts), -1, dtype=np.int64)
        active, nodes = len(prompts), 0
        for level in range(int(needed.max(initial=0))):
            while active and needed[by_length[active - 1]] <= level:
                active -= 1
            running = by_length[:active]
            at = starts[running] + level
            keys, inverse = np.unique(
                (parent[running] + 1) * width + tokens[at], return_inverse=True
            )
            node[at] = parent[running] = nodes + inverse
            nodes += len(keys)
        self._nodes = nodes
        self._owner = np.repeat(np.arange(len(prompts)), needed)

    def shared(self, pool_of: np.ndarray | None) -> list[int]:
        """Each request's shared blocks; with ``pool_of`` (each request's pool), with the
        requests of its own pool only: the trie of a pool has the (pool, node) pairs of
        its requests as nodes."""
        node, nodes, owner, full = self._node, self._nodes, self._owner, self._full
        starts, needed = self._starts, self._needed
        if pool_of is not None:
            keys, node = np.unique(pool_of[owner] * nodes + node, return_inverse=True)
            nodes = len(keys)
        longest = full[owner]
        # Per node, entries by length descending (ties: trace order): the best, then the second.
        order = np.lexsort((owner, -longest, node))
        sorted_nodes = node[order]
        head = np.ones(len(order), dtype=bool)
        head[1:] = sorted_nodes[1:] != sorted_nodes[:-1]
        best = np.zeros(nodes, dtype=np.int64)
        best_owner = np.full(nodes, -1, dtype=np.int64)
        second = np.zeros(nodes, dtype=np.int64)
        best[sorted_nodes[head]] = longest[order[head]]
        best_owner[sorted_nodes[head]] = owner[order[head]]
        runner_up = np.flatnonzero(head[:-1] & ~head[1:]) + 1
        second[sorted_nodes[runner_up]] = longest[order[runner_up]]
        other = np.where(best_owner[node] == owner, second[node], best[node])
        depth = np.arange(len(node)) - starts[owner] + 1
        covered = np.minimum(depth * self._tbs[owner] // self._bs, longest)  # what the ids cover
        # Shared up to the first depth where the other request falls short of what it covers.
        short = np.flatnonzero(other < covered)  # ascending, so grouped by request
        earliest = np.ones(len(short), dtype=bool)
        earliest[1:] = owner[short[1:]] != owner[short[:-1]]
        first_short = np.full(len(full), -1, dtype=np.int64)
        first_short[owner[short[earliest]]] = short[earliest]
        shared = np.zeros(len(full), dtype=np.int64)
        ran = needed > 0
        last = starts + needed - 1
        shared[ran] = covered[last[ran]]
        cut = first_short >= 0
        at = first_short[cut]
        before = np.where(depth[at] > 1, covered[at - 1], 0)
        shared[cut] = np.maximum(before, other[at])
        return shared.tolist()
