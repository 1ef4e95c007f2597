"""Packed Bernoulli masks from a seeded, counter-based random source.

``bernoulli_mask(key, nbytes, p)`` returns ``nbytes`` uint8 bytes whose 8*nbytes bits are
independent and each 1 with probability ``p`` (rounded to a multiple of 2**-DIGITS). The bytes
depend only on ``key`` (a tuple of non-negative integers, e.g. (seed, step, rank, chunk)) and not
on the machine, the process or the framework, so any rank can reproduce any other's mask.

Method: draw a uniform U = 0.u1 u2 ... bit by bit and set the bit iff U < p, with
``p = 0.d1 d2 ... dL`` in binary (L: the position of p's last 1-digit). Digit i decides every
still-undecided element whose u_i differs from d_i (u_i < d_i: 1, u_i > d_i: 0); elements equal to
p on all L digits have U >= p: 0. So P(bit = 1) is exactly p, and half of the undecided elements
are decided at each digit. One 64-bit random word serves 64 elements at a digit: the first
FULL_DIGITS digits are drawn for every word; after them, only the words that still hold an
undecided element draw further digits (about 6% of the words after 10 digits, re-compacted every
COMPACT_EVERY digits). A mask costs at most about FULL_DIGITS + 1 random words per 64 elements,
however many digits p has (p = 1/3 has 24: 24 words before this), and no floating point.
"""
import numpy as np

from hvdcomp.backend.xp import from_host

DIGITS = 24  # probability resolution: 2**-24
FULL_DIGITS = 10  # digits drawn for every word; afterwards ~6% of the words hold undecided elements
COMPACT_EVERY = 4  # digits between two compactions of the undecided words


def mask_words_digits(p, digits=DIGITS):
    """The binary digits d1..dL of ``p`` in [0, 1] (rounded to ``digits`` places), as a list."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"probability must lie in [0, 1], got {p}")
    q = int(round(p * (1 << digits)))
    if q >= (1 << digits):
        return None  # p == 1
    return [(q >> (digits - 1 - i)) & 1 for i in range(digits)]


def _digit(out, undecided, word, one):
    """Apply one digit of p to ``out``/``undecided`` (uint64 words, in place), given the random
    word ``word`` of that digit (consumed as scratch): where still undecided, u_i = 0 < d_i = 1
    sets the bit; u_i = 1 > d_i = 0 leaves it 0; equal digits stay undecided."""
    np.invert(word, out=word)
    if one:
        np.bitwise_and(word, undecided, out=word)  # undecided and u_i = 0: decided 1
        np.bitwise_or(out, word, out=out)
        np.bitwise_xor(undecided, word, out=undecided)
    else:
        np.bitwise_and(undecided, word, out=undecided)  # u_i = 1: decided 0


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
            draw = gen.bit_generator.random_raw
            length = ones[-1] + 1  # digits after p's last 1-digit decide nothing new
            undecided = draw(nwords).astype(np.uint64, copy=False)  # u_1 of every element
            if d[0]:  # u_1 = 0 < d_1 = 1: decided 1; u_1 = 1 = d_1: undecided
                np.invert(undecided, out=words)
            else:  # u_1 = 1 > d_1 = 0: decided 0; u_1 = 0 = d_1: undecided
                np.invert(undecided, out=undecided)
            for i in range(1, min(length, FULL_DIGITS)):
                _digit(words, undecided, draw(nwords).astype(np.uint64, copy=False), d[i])
            pos = None
            for i in range(FULL_DIGITS, length):
                if (i - FULL_DIGITS) % COMPACT_EVERY == 0:  # keep only words still undecided
                    if pos is None:
                        pos = np.flatnonzero(undecided)
                        out, undecided = words[pos], undecided[pos]
                    else:
                        words[pos] = out
                        keep = np.flatnonzero(undecided)
                        pos, out, undecided = pos[keep], out[keep], undecided[keep]
                    if not pos.size:
                        break
                _digit(out, undecided, draw(pos.size).astype(np.uint64, copy=False), d[i])
            if pos is not None:
                words[pos] = out
    mask = words.view(np.uint8)[:nbytes]
    return from_host(mask, like) if like is not None else mask
