"""Packed Bernoulli masks from a seeded, counter-based random source.

``bernoulli_mask(key, nbytes, p)`` returns ``nbytes`` uint8 bytes whose 8*nbytes bits are
independent and each 1 with probability ``p`` (rounded to a multiple of 2**-DIGITS). The bytes
depend only on ``key`` (a tuple of non-negative integers, e.g. (seed, step, rank, chunk)) and not
on the machine, the process or the framework, so any rank can reproduce any other's mask.

Method: with ``p = 0.d1 d2 ... dL`` in binary, start from all-zero words and, for the digits from
the last 1-digit up to d1, combine with a fresh uniformly random word: OR for a 1-digit, AND for a
0-digit. After digit i the probability of a 1 is (d_i + previous)/2, which ends at exactly p.
One 64-bit random word serves 64 elements, so a mask costs at most L/64 random words per
element and no floating point.
"""
import numpy as np

from hvdcomp.backend.xp import from_host

DIGITS = 24  # probability resolution: 2**-24


def mask_words_digits(p, digits=DIGITS):
    """The binary digits d1..dL of ``p`` in [0, 1] (rounded to ``digits`` places), as a list."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"probability must lie in [0, 1], got {p}")
    q = int(round(p * (1 << digits)))
    if q >= (1 << digits):
        return None  # p == 1
    return [(q >> (digits - 1 - i)) & 1 for i in range(digits)]


def bernoulli_mask(key, nbytes, p, like=None, digits=DIGITS):
    """``nbytes`` packed mask bytes with P(bit = 1) = p; NumPy uint8, or like ``like``."""
    nbytes = int(nbytes)
    nwords = (nbytes + 7) // 8
    d = mask_words_digits(p, digits)
    if d is None:
        words = np.full(nwords, np.uint64(0xFFFFFFFFFFFFFFFF), dtype=np.uint64)
    else:
        words = np.zeros(nwords, dtype=np.uint64)
        ones = [i for i, b in enumerate(d) if b]
        if ones and nwords:
            gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(key))))
            for i in range(ones[-1], -1, -1):
                w = gen.bit_generator.random_raw(nwords).astype(np.uint64, copy=False)
                if d[i]:
                    np.bitwise_or(words, w, out=words)
                else:
                    np.bitwise_and(words, w, out=words)
    mask = words.view(np.uint8)[:nbytes]
    return from_host(mask, like) if like is not None else mask
