"""The reference's seeded generator, so that seeded streams (Poisson arrivals, synthetic
prefix groups, speculative bursts) are its streams.

Rust's ``StdRng::seed_from_u64`` (the ``rand`` crate): the 64-bit seed is
expanded into a 32-byte key by a PCG32 generator, and the stream is the
ChaCha12 keystream under that key (nonce 0, block counter from 0). A u64 is
two consecutive 32-bit words, low first; a float in [0, 1) is its top 53 bits
times 2^-53. Blocks are computed many at a time with numpy.
"""

from __future__ import annotations

import numpy as np

_MASK64 = (1 << 64) - 1
_CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)
# (a, b, c, d) word indices of ChaCha's column and diagonal quarter rounds.
_QUARTER_ROUNDS = (
    (0, 4, 8, 12),
    (1, 5, 9, 13),
    (2, 6, 10, 14),
    (3, 7, 11, 15),
    (0, 5, 10, 15),
    (1, 6, 11, 12),
    (2, 7, 8, 13),
    (3, 4, 9, 14),
)


def _pcg32_key(seed: int) -> list[int]:
    """The eight key words ``seed_from_u64`` derives from ``seed``."""
    state = seed & _MASK64
    words = []
    for _ in range(8):
        state = (state * 6364136223846793005 + 11634580027462260723) & _MASK64
        xorshifted = (((state >> 18) ^ state) >> 27) & 0xFFFFFFFF
        rot = state >> 59
        words.append(((xorshifted >> rot) | (xorshifted << ((32 - rot) & 31))) & 0xFFFFFFFF)
    return words


def _rotl(x: np.ndarray, n: int) -> np.ndarray:
    return (x << np.uint32(n)) | (x >> np.uint32(32 - n))


def _chacha12_blocks(key: list[int], first: int, count: int) -> np.ndarray:
    """Keystream blocks ``first .. first + count - 1``, as a (count, 16) array of words."""
    counters = np.arange(first, first + count, dtype=np.uint64)
    state = [np.full(count, w, dtype=np.uint32) for w in (*_CONSTANTS, *key)]
    state += [
        (counters & np.uint64(0xFFFFFFFF)).astype(np.uint32),
        (counters >> np.uint64(32)).astype(np.uint32),
        np.zeros(count, dtype=np.uint32),
        np.zeros(count, dtype=np.uint32),
    ]
    w = [x.copy() for x in state]
    for _ in range(6):  # 12 rounds: six double rounds
        for a, b, c, d in _QUARTER_ROUNDS:
            w[a] += w[b]
            w[d] = _rotl(w[d] ^ w[a], 16)
            w[c] += w[d]
            w[b] = _rotl(w[b] ^ w[c], 12)
            w[a] += w[b]
            w[d] = _rotl(w[d] ^ w[a], 8)
            w[c] += w[d]
            w[b] = _rotl(w[b] ^ w[c], 7)
    return np.stack([w[i] + state[i] for i in range(16)], axis=1)


def uniform_floats(seed: int, count: int) -> np.ndarray:
    """The first ``count`` floats in [0, 1) that Rust's ``StdRng::seed_from_u64(seed)`` draws."""
    if count <= 0:
        return np.zeros(0, dtype=np.float64)
    blocks = -(-count // 8)  # eight u64 a block
    words = _chacha12_blocks(_pcg32_key(seed), 0, blocks).reshape(-1).astype(np.uint64)
    u64 = words[0::2] | (words[1::2] << np.uint64(32))
    return (u64[:count] >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


class StdRng:
    """Rust's ``StdRng::seed_from_u64(seed)`` as a stream of draws.

    The stream is the keystream's 32-bit words in order: ``next_u32`` takes
    one word, ``next_u64`` two (low first), as ``rand_core``'s block reader
    does. Keystream blocks are made 64 at a time. ``random_bool`` and
    ``random_range`` are the ``rand`` 0.9 crate's.
    """

    __slots__ = ("_block", "_key", "_next", "_words")

    _BLOCKS = 64

    def __init__(self, seed: int) -> None:
        self._key = _pcg32_key(seed)
        self._block = 0
        self._words: list[int] = []
        self._next = 0

    def _refill(self) -> None:
        """Append the next keystream blocks' words, dropping the words already taken."""
        words = _chacha12_blocks(self._key, self._block, self._BLOCKS).reshape(-1).tolist()
        self._block += self._BLOCKS
        self._words = self._words[self._next :] + words
        self._next = 0

    def next_u32(self) -> int:
        """The next 32-bit word of the stream."""
        if self._next == len(self._words):
            self._refill()
        value: int = self._words[self._next]
        self._next += 1
        return value

    def next_u64(self) -> int:
        """The next u64 of the stream: two words, low first."""
        if self._next + 2 > len(self._words):
            self._refill()
        i = self._next
        self._next = i + 2
        words = self._words
        value: int = words[i] | words[i + 1] << 32
        return value

    def random_bool(self, p: float) -> bool:
        """True with probability ``p`` (in [0, 1]).

        A Bernoulli(p) draw compares one u64 with ``p x 2^64`` (truncated),
        except that p = 1 draws nothing.
        """
        if p == 1.0:
            return True
        return self.next_u64() < int(p * 18446744073709551616.0)

    def random_range(self, n: int) -> int:
        """A uniform integer in ``[0, n)``, for ``1 <= n <= 2^32``: ``rng.random_range(0..n)``.

        ``rand`` 0.9 samples a ``usize`` range that fits in 32 bits as a u32
        with Canon's method: the high word of one word times ``n``, plus a
        carry from a second word in the rare case (probability about
        ``n / 2^32``) that the low word is too close to overflowing.
        """
        if not 1 <= n <= 1 << 32:
            raise ValueError(f"random_range needs 1 <= n <= 2^32, got {n}")
        if n == 1 << 32:  # the range wraps to 0 in u32: any word
            return self.next_u32()
        product = self.next_u32() * n
        result, low = product >> 32, product & 0xFFFFFFFF
        if low > (-n) & 0xFFFFFFFF:
            carry = (self.next_u32() * n) >> 32
            result += int(low + carry > 0xFFFFFFFF)
        return result
