"""Block and sequence hashes, byte-compatible with the reference (and Dynamo's router).

A *local* block hash is ``xxh3_64`` (seed 1337) of the block's tokens as
little-endian u32. The *sequence* hash of block 0 is its local hash; block i
chains its parent: ``xxh3_64(parent_seq ‖ local)`` over two little-endian u64.
Only full blocks are hashed. ::

    tokens   |t0 .. t63|t64 .. t127|t128 .. t150|   (block_size 64, 151 tokens)
    local    |   L0    |    L1     |  (partial)  |
    sequence | S0 = L0 | S1 = H(S0‖L1) |   none   |
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import xxhash

SEED = 1337
"""The reference's hash seed (``MOCKER_SALT_HASH``)."""

_xxh3 = xxhash.xxh3_64_intdigest
_pack_pair = struct.Struct("<QQ").pack


def hash_tokens(data: bytes) -> int:
    """Local hash of one full block given as little-endian u32 token bytes."""
    return int(_xxh3(data, SEED))


def chain(parent: int | None, local: int) -> int:
    """Sequence hash of a block whose parent block has sequence hash ``parent``."""
    if parent is None:
        return local
    return int(_xxh3(_pack_pair(parent, local), SEED))


def chain_all(locals_: Iterable[int], parent: int | None = None) -> list[int]:
    """Sequence hashes of consecutive blocks, starting after ``parent``."""
    out: list[int] = []
    xxh3, pack = _xxh3, _pack_pair
    for local in locals_:
        parent = local if parent is None else xxh3(pack(parent, local), SEED)
        out.append(parent)
    return out


GENERATED_SEED = 0x67656E65726174
"""Seed of :func:`generated_block_hash`: not the token hashes' :data:`SEED`, so no block of
tokens hashes alike (the bytes of (salt 0, index 0) are those of four 0 tokens)."""


def generated_block_hash(salt: int, block_index: int) -> int:
    """Local hash of a block that holds generated tokens.

    The reference samples generated tokens at random, so a block holding any of
    them never matches another request's block; it only matches the same
    request's own copy after a preemption. Hashing (request salt, block index)
    gives exactly that identity without keeping per-token objects, under a seed
    of its own (with the token seed, the first request's first such page on
    4-token pages hashed as a prompt page of the first trace token, 0).
    """
    return int(_xxh3(_pack_pair(salt, block_index), GENERATED_SEED))
