"""A block holding generated tokens never hashes as a block of prompt tokens."""

from __future__ import annotations

from servesim.engine.kv.hashing import generated_block_hash, hash_tokens


def test_first_generated_page_is_not_a_page_of_token_zero() -> None:
    # (salt 0, index 0) packs to the 16 bytes of four 0 tokens: the first request's
    # first generated page on 4-token pages must still not be the first trace token's.
    assert generated_block_hash(0, 0) != hash_tokens(bytes(16))
    # Nor any page of 4 tokens laid out as (salt, 0, index, 0).
    for salt in range(4):
        for index in range(4):
            data = b"".join(t.to_bytes(4, "little") for t in (salt, 0, index, 0))
            assert generated_block_hash(salt, index) != hash_tokens(data)
