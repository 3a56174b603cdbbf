"""Where cached blocks live, learned only from the engines' KV events.

One index for a pool: for each block sequence hash, the set of targets
(worker DP ranks, as global ids) holding it, kept as a bit mask. A ``Stored``
event adds its blocks to the target; ``Removed`` takes them away. Because a
sequence hash names a block *and its whole prefix* (hashes chain), a
request's overlap on a target is the number of its leading hashes that the
target holds, stopping at the first miss: a ``Removed`` in the middle of a
chain cuts the overlap there even if later blocks are still held.

A lookup walks the request's hashes once, narrowing the mask of targets still
matching, so it costs O(prefix length), never O(targets x cache size).

Host-tier events (``host``) go to a second map of the same shape: the blocks
each target's host tier holds. A target's host *extension* continues its
device prefix: the consecutive blocks after it that its host tier holds (from
the first block when the device holds none), so a block cached on both
counts once, on the device.
"""

from __future__ import annotations

from collections.abc import Iterable

from servesim.engine.kv.block_pool import KvEvent, KvStored


class KvIndexer:
    """Block hash -> bit mask of the targets holding it."""

    __slots__ = ("_holders", "_host")

    def __init__(self) -> None:
        self._holders: dict[int, int] = {}
        self._host: dict[int, int] = {}

    def apply(self, target: int, events: Iterable[KvEvent]) -> None:
        """Apply one target's KV events, in order."""
        bit = 1 << target
        for event in events:
            holders = self._host if event.host else self._holders
            if isinstance(event, KvStored):
                get = holders.get
                for h in event.hashes:
                    holders[h] = get(h, 0) | bit
                continue
            keep, take = ~bit, holders.pop
            for h in event.hashes:
                left = take(h, 0) & keep  # (one look-up when only this target held it)
                if left:
                    holders[h] = left

    def overlaps(self, hashes: list[int]) -> dict[int, int]:
        """For each target holding the first block: how many leading blocks it holds."""
        get = self._holders.get
        matching = get(hashes[0], 0) if hashes else 0
        found: dict[int, int] = {}
        for depth, h in enumerate(hashes):
            still = matching & get(h, 0)
            if still != matching:  # (rare: most blocks are held by the same targets as the last)
                dropped = matching & ~still
                while dropped:
                    low = dropped & -dropped
                    found[low.bit_length() - 1] = depth
                    dropped ^= low
                matching = still
                if not matching:
                    return found
        while matching:
            low = matching & -matching
            found[low.bit_length() - 1] = len(hashes)
            matching ^= low
        return found

    def host_extensions(self, hashes: list[int], device: dict[int, int]) -> dict[int, int]:
        """For each target whose host tier continues its device prefix (``device``, from
        :meth:`overlaps`): how many consecutive blocks it holds after that prefix."""
        host = self._host
        if not host or not hashes:
            return {}
        get = host.get
        n = len(hashes)
        starts = dict(device)
        root = get(hashes[0], 0)
        while root:
            low = root & -root
            starts.setdefault(low.bit_length() - 1, 0)
            root ^= low
        found: dict[int, int] = {}
        for target, start in starts.items():
            bit = 1 << target
            end = start
            while end < n and get(hashes[end], 0) & bit:
                end += 1
            if end > start:
                found[target] = end - start
        return found

    def holders(self, block_hash: int) -> frozenset[int]:
        """Targets holding a block (for tests and diagnostics)."""
        mask = self._holders.get(block_hash, 0)
        return frozenset(t for t in range(mask.bit_length()) if mask >> t & 1)
