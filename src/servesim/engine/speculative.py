"""Speculative decoding (MTP/Eagle) as the reference models it: a burst of tokens per step.

A decode step verifies ``aic_nextn`` draft tokens: the first is accepted with
its conditional rate, each next one only if all before it were, and the step
emits the accepted drafts plus one token of its own. The draws come from the
rank's generator, Rust's ``StdRng`` seeded with ``aic_mtp_seed`` plus the
rank's index, so seeded runs are the reference's runs.
"""

from __future__ import annotations

from servesim.workload.rng import StdRng


class SpeculativeSampler:
    """Samples burst lengths, 1 to ``len(rates) + 1`` tokens, for one rank."""

    __slots__ = ("_rates", "_rng", "accepted")

    def __init__(self, rates: tuple[float, ...], seed: int) -> None:
        self._rates = rates
        self._rng = StdRng(seed)
        # The last step's accepted length before the cap (what telemetry averages).
        self.accepted = 0

    def burst(self, remaining: int) -> int:
        """Tokens one step emits for a request that may still generate ``remaining``.

        Every rate is drawn in order until the first rejection, whatever
        ``remaining`` (as the reference draws); the burst is then capped by it.
        """
        if remaining <= 0:
            return 0
        tokens = 1
        random_bool = self._rng.random_bool
        for rate in self._rates:
            if not random_bool(rate):
                break
            tokens += 1
        self.accepted = tokens
        return min(tokens, remaining)
