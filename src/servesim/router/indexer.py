"""Where cached blocks live, learned only from the engines' KV events.

One index for a pool: for each block sequence hash, the set of targets
(worker DP ranks, as global ids) holding it. A ``Stored`` event adds its
blocks to the target; ``Removed`` takes them away. Because a sequence hash
names a block *and its whole prefix* (hashes chain), a request's overlap on a
target is the number of its leading hashes that the target holds, stopping at
the first miss: a ``Removed`` in the middle of a chain cuts the overlap there
even if later blocks are still held.

A lookup walks the request's hashes once, narrowing the set of targets still
matching, so it costs O(prefix length x matching targets), never
O(targets x cache size).
"""

from __future__ import annotations

from collections.abc import Iterable

from servesim.engine.kv.block_pool import KvEvent, KvRemoved, KvStored


class KvIndexer:
    """Block hash -> targets holding it."""

    __slots__ = ("_holders",)

    def __init__(self) -> None:
        self._holders: dict[int, set[int]] = {}

    def apply(self, target: int, events: Iterable[KvEvent]) -> None:
        """Apply one target's KV events, in order."""
        holders = self._holders
        for event in events:
            if isinstance(event, KvStored):
                for h in event.hashes:
                    holding = holders.get(h)
                    if holding is None:
                        holders[h] = {target}
                    else:
                        holding.add(target)
            elif isinstance(event, KvRemoved):
                for h in event.hashes:
                    holding = holders.get(h)
                    if holding is not None:
                        holding.discard(target)
                        if not holding:
                            del holders[h]

    def overlaps(self, hashes: list[int]) -> dict[int, int]:
        """For each target holding the first block: how many leading blocks it holds."""
        holders = self._holders
        if not hashes or hashes[0] not in holders:
            return {}
        matching = set(holders[hashes[0]])
        depth = 1
        found: dict[int, int] = {}
        for h in hashes[1:]:
            holding = holders.get(h)
            still = matching & holding if holding else set()
            for target in matching - still:
                found[target] = depth
            matching = still
            if not matching:
                return found
            depth += 1
        for target in matching:
            found[target] = depth
        return found

    def holders(self, block_hash: int) -> frozenset[int]:
        """Targets holding a block (for tests and diagnostics)."""
        return frozenset(self._holders.get(block_hash, ()))
