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

Trace prompts share blocks through their hash ids: engine block j (of size
``bs``) depends on the first ``ceil((j + 1) bs / tbs)`` ids; synthetic sessions'
prompts are trace prompts too (one id per engine block). One-shot synthetic
prompts share nothing.
"""

from __future__ import annotations

from servesim.workload.request import RequestSpec, Session, SyntheticPrompt, TracePrompt


def mark_shared_blocks(sessions: list[Session], block_size: int) -> None:
    """Set ``shared_blocks`` on every request of the workload, for engine blocks of ``block_size``."""
    specs = [spec for session in sessions for spec in session.turns]
    trace = [(i, spec) for i, spec in enumerate(specs) if isinstance(spec.prompt, TracePrompt)]
    for spec in specs:
        if isinstance(spec.prompt, SyntheticPrompt):
            spec.shared_blocks = 0
    if trace:
        _mark_trace(trace, block_size)


def _covered(ids: int, tbs: int, bs: int, full: int) -> int:
    """Full engine blocks whose tokens all come from the first ``ids`` trace blocks."""
    return min(ids * tbs // bs, full)


def _mark_trace(trace: list[tuple[int, RequestSpec]], bs: int) -> None:
    # A trie over hash-id prefixes, as a dict (parent node << 32 | token) -> node
    # (tokens are dense u32 ids). Each node keeps the two largest full-block counts
    # of the requests through it, and who had the largest, so "the longest other
    # request through this node" is O(1).
    children: dict[int, int] = {}
    best: list[int] = [0]
    best_owner: list[int] = [-1]
    second: list[int] = [0]
    paths: list[list[int]] = []
    for owner, spec in trace:
        prompt = spec.prompt
        assert isinstance(prompt, TracePrompt)
        full = prompt.length // bs
        needed = -(-full * bs // prompt.trace_block_size)  # ids that full blocks depend on
        node, path = 0, []
        for token in prompt.tokens[:needed]:
            key = node << 32 | token
            child = children.get(key)
            if child is None:
                child = children[key] = len(best)
                best.append(0)
                best_owner.append(-1)
                second.append(0)
            node = child
            path.append(node)
            if full > best[node]:
                second[node], best[node], best_owner[node] = best[node], full, owner
            elif full > second[node]:
                second[node] = full
        paths.append(path)
    for (owner, spec), path in zip(trace, paths, strict=True):
        prompt = spec.prompt
        assert isinstance(prompt, TracePrompt)
        tbs, full = prompt.trace_block_size, prompt.length // bs
        shared = 0
        for depth, node in enumerate(path, start=1):
            other = second[node] if best_owner[node] == owner else best[node]
            end = _covered(depth, tbs, bs, full)
            if other < end:
                shared = max(shared, min(other, end))
                break
            shared = end
        spec.shared_blocks = shared
