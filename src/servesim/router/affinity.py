"""Session affinity (simulation-only modes of the reference): keep a session's turns together.

- ``local``: a session goes where its first turn went (the binding table keeps
  at most 65,536 sessions, least recently used out first).
- ``modulo``: target = hash(session) mod the number of targets.
- ``hrw``: rendezvous hashing, the target with the highest hash(session, target).

Hashes are xxh3_64 with the project's seed, so placements repeat across runs.
"""

from __future__ import annotations

from collections import OrderedDict

import xxhash

from servesim.engine.kv.hashing import SEED

MODES = ("disabled", "local", "modulo", "hrw")
LOCAL_CAPACITY = 65536


def _hash(session: str, target: int | None = None) -> int:
    data = session.encode() if target is None else session.encode() + target.to_bytes(8, "little")
    return int(xxhash.xxh3_64_intdigest(data, SEED))


class SessionAffinity:
    """Which target a session's request should go to, if any."""

    def __init__(self, mode: str, targets: int) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown session affinity {mode!r}")
        self.mode = mode
        self._targets = targets
        self._bound: OrderedDict[str, int] = OrderedDict()

    def preferred(self, session: str | None) -> int | None:
        """The target the session is tied to; None lets the router choose."""
        if session is None or self.mode == "disabled":
            return None
        if self.mode == "modulo":
            return _hash(session) % self._targets
        if self.mode == "hrw":
            return max(range(self._targets), key=lambda t: _hash(session, t))
        target = self._bound.get(session)
        if target is not None:
            self._bound.move_to_end(session)
        return target

    def placed(self, session: str | None, target: int) -> None:
        """The session's request went to ``target`` (``local`` binds its first choice)."""
        if session is None or self.mode != "local" or session in self._bound:
            return
        self._bound[session] = target
        if len(self._bound) > LOCAL_CAPACITY:
            self._bound.popitem(last=False)
