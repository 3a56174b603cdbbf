"""A request as one engine rank sees it: its tokens, KV blocks and progress."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from servesim.engine.kv.radix_cache import RadixLease


class Prompt(Protocol):
    """The prompt's tokens, seen through the hashes of its full blocks."""

    @property
    def length(self) -> int:
        """Number of prompt tokens."""
        ...

    def block_hashes(self, block_size: int, count: int) -> list[int]:
        """Local hashes of the prompt's first ``count`` full blocks of ``block_size`` tokens."""
        ...

    def sequence_hashes(self, block_size: int, count: int) -> list[int]:
        """Sequence hashes (each chained to the blocks before it) of those blocks."""
        ...


ALL_BLOCKS = 1 << 62
"""``named_blocks`` of a request whose every block is cached under its hash."""


class Status(IntEnum):
    """Where a request is in one rank's scheduler."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3


# (A module constant: an enum member read off its class costs ~900 instructions.)
_WAITING = Status.WAITING


class EngineRequest:
    """One request inside a rank's scheduler.

    The sequence is the prompt followed by ``generated`` output tokens. The
    newest output token is *dangling*: it is computed (and gets its KV slot) by
    the next pass, so a decoding request has ``num_computed == length - 1``
    between passes. ``hashes`` holds the sequence hashes of its full blocks,
    extended as blocks fill.
    """

    __slots__ = (
        "blocks",
        "cohort_base",
        "finish_step",
        "generated",
        "hashes",
        "host_reused",
        "joined_step",
        "lease",
        "max_output",
        "named_blocks",
        "num_computed",
        "num_preemptions",
        "pending_cached",
        "prompt",
        "prompt_len",
        "salt",
        "seq",
        "sequence",
        "status",
        "uid",
    )

    def __init__(
        self,
        uid: int,
        prompt: Prompt,
        max_output: int,
        shared_blocks: int | None = None,
        sequence: Prompt | None = None,
        *,
        salt: int | None = None,
    ) -> None:
        self.uid = uid
        self.prompt = prompt
        # The prompt followed by the output tokens, when the workload knows them (a later
        # turn's prompt repeats them): blocks of generated tokens are then hashed from
        # their content, not as the request's own.
        self.sequence = sequence
        self.prompt_len = prompt.length
        self.max_output = max_output
        self.salt = uid if salt is None else salt
        self.generated = 0
        self.num_computed = 0
        self.num_preemptions = 0
        self.pending_cached = 0
        # Of the prefix its latest admission reused, the tokens loaded from a host tier
        # (None: its rank has no host tier).
        self.host_reused: int | None = None
        self.status = _WAITING
        # Admission order on its rank (running order); see VllmScheduler's decode cohort
        # for the other three, which hold a lazily advanced decoder's progress.
        self.seq = 0
        self.cohort_base = 0
        self.joined_step = 0
        self.finish_step = 0
        self.blocks: list[int] = []
        self.hashes: list[int] = []
        # Leading blocks cached under their hash; later ones are cached unnamed
        # (no other request can match them) until a preemption names them.
        self.named_blocks = ALL_BLOCKS if shared_blocks is None else shared_blocks
        # Its pages on an SGLang rank (see servesim.engine.sglang).
        self.lease: RadixLease | None = None

    @property
    def length(self) -> int:
        """Tokens in the sequence: prompt plus generated."""
        return self.prompt_len + self.generated

    def __repr__(self) -> str:
        return (
            f"EngineRequest(uid={self.uid}, status={self.status.name}, len={self.length}, "
            f"computed={self.num_computed}, generated={self.generated}/{self.max_output})"
        )
