"""The numba kernel behind :mod:`gpuclust.ingest.readers._fast_usage` (imported, and so numba
imported, only when an InstanceUsage JSON piece is read).

Field numbers follow ``_fast_usage.KEYS``: 0-7 INT64 fields, 8-10 the usage objects, 11-15 the
plain floats, 16-17 the percentile arrays.  Unsigned 64-bit arithmetic is spelled with
``np.uint64`` throughout: numba turns ``uint64 op int64`` into float64.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from gpuclust.ingest.readers._pow10 import POW_MAX, POW_MIN

_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U10 = np.uint64(10)
_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_TOP = np.uint64(1 << 63)
_MAX53 = np.uint64(1 << 53)
_LOW9 = np.uint64(0x1FF)
_P10 = np.array([10.0**i for i in range(23)], dtype=np.float64)

OK = 0
#: Why a piece was refused (the caller only needs "not OK").
BAD, BLANK, ROOM = 1, 2, 3
#: What :func:`_number` found.
NUM_OK, NUM_HARD, NUM_BAD = 0, 1, 2
#: Where a hard number's value goes (``hard_kind``): ``res``, ``flt`` or ``lvals``.
HARD_RES, HARD_FLT, HARD_LIST = 0, 1, 2


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _ws(buf, p, n):
    while p < n:
        c = buf[p]
        if c == 32 or c == 9 or c == 13:
            p += 1
        else:
            break
    return p


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _mul128(a, b):
    """(hi, lo) of the 128-bit product of two uint64."""
    a_lo = a & _M32
    a_hi = a >> _S32
    b_lo = b & _M32
    b_hi = b >> _S32
    p0 = a_lo * b_lo
    p1 = a_lo * b_hi
    p2 = a_hi * b_lo
    p3 = a_hi * b_hi
    mid = (p0 >> _S32) + (p1 & _M32) + (p2 & _M32)
    lo = (p0 & _M32) | (mid << _S32)
    hi = p3 + (p1 >> _S32) + (p2 >> _S32) + (mid >> _S32)
    return hi, lo


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _clz(x):
    n = 0
    if x == _U0:
        return 64
    while (x & _TOP) == _U0:
        x = x << _U1
        n += 1
    return n


@njit(cache=True, nogil=True, _nrt=False)
def _eisel_lemire(man, e10, hi_t, lo_t):
    """The double nearest to man * 10^e10 (man > 0), or ok=False when not decided here."""
    if e10 < POW_MIN or e10 > POW_MAX:
        return 0.0, False
    clz = _clz(man)
    man = man << np.uint64(clz)
    ret_exp2 = np.int64(((217706 * e10) >> 16) + 64 + 1023 - clz)
    t_hi = hi_t[e10 - POW_MIN]
    t_lo = lo_t[e10 - POW_MIN]
    x_hi, x_lo = _mul128(man, t_hi)
    if (x_hi & _LOW9) == _LOW9 and x_lo + man < man:
        y_hi, y_lo = _mul128(man, t_lo)
        m_hi = x_hi
        m_lo = x_lo + y_hi
        if m_lo < x_lo:
            m_hi += _U1
        if (m_hi & _LOW9) == _LOW9 and m_lo + _U1 == _U0 and y_lo + man < man:
            return 0.0, False
        x_hi = m_hi
        x_lo = m_lo
    msb = x_hi >> np.uint64(63)
    ret_man = x_hi >> (msb + np.uint64(9))
    ret_exp2 -= np.int64(1) ^ np.int64(msb)
    if x_lo == _U0 and (x_hi & _LOW9) == _U0 and (ret_man & np.uint64(3)) == _U1:
        return 0.0, False
    ret_man += ret_man & _U1
    ret_man = ret_man >> _U1
    if (ret_man >> np.uint64(53)) > _U0:
        ret_man = ret_man >> _U1
        ret_exp2 += 1
    if ret_exp2 <= 0 or ret_exp2 >= 0x7FF:
        return 0.0, False
    # ret_man holds 53 bits (the implicit one included): the value is exact in a double.
    return math.ldexp(float(ret_man), ret_exp2 - 1075), True


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _number(buf, p, n, hi_t, lo_t):
    """A JSON number at ``buf[p]``: (position after it, value, status) with status NUM_OK,
    NUM_HARD (a valid number this code does not convert: the caller converts its text with a
    correctly rounded parser) or NUM_BAD (not a JSON number)."""
    neg = False
    if p < n and buf[p] == 45:  # '-'
        neg = True
        p += 1
    if p >= n:
        return p, 0.0, NUM_BAD
    c = buf[p]
    man = _U0
    nd = 0
    e10 = 0
    dropped = False
    if c == 48:  # '0': no more integer digits
        p += 1
        if p < n and 48 <= buf[p] <= 57:
            return p, 0.0, NUM_BAD
    elif 49 <= c <= 57:
        while p < n:
            c = buf[p]
            if c < 48 or c > 57:
                break
            if nd < 19:
                man = man * _U10 + np.uint64(c - 48)
                nd += 1
            else:
                dropped = True
            p += 1
    else:
        return p, 0.0, NUM_BAD
    if p < n and buf[p] == 46:  # '.'
        p += 1
        start = p
        while p < n:
            c = buf[p]
            if c < 48 or c > 57:
                break
            if man == _U0 and c == 48:
                e10 -= 1
            elif nd < 19:
                man = man * _U10 + np.uint64(c - 48)
                nd += 1
                e10 -= 1
            else:
                dropped = True
            p += 1
        if p == start:
            return p, 0.0, NUM_BAD
    if p < n and (buf[p] == 101 or buf[p] == 69):  # 'e' / 'E'
        p += 1
        eneg = False
        if p < n and (buf[p] == 43 or buf[p] == 45):
            eneg = buf[p] == 45
            p += 1
        start = p
        ex = 0
        while p < n:
            c = buf[p]
            if c < 48 or c > 57:
                break
            if ex < 100000:
                ex = ex * 10 + (c - 48)
            p += 1
        if p == start:
            return p, 0.0, NUM_BAD
        e10 += -ex if eneg else ex
    if dropped:
        return p, 0.0, NUM_HARD
    if man == _U0:
        return p, (-0.0 if neg else 0.0), NUM_OK
    if man <= _MAX53 and -22 <= e10 <= 22:
        v = float(man)
        if e10 >= 0:
            v = v * _P10[e10]
        else:
            v = v / _P10[-e10]
    else:
        v, ok = _eisel_lemire(man, e10, hi_t, lo_t)
        if not ok:
            return p, 0.0, NUM_HARD
    return p, (-v if neg else v), NUM_OK


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _int(buf, p, n):
    """An INT64 field at ``buf[p]``: quoted ``-?[0-9]{1,19}`` or an unquoted JSON integer.
    (position after it, value, ok)."""
    quoted = buf[p] == 34
    if quoted:
        p += 1
    neg = False
    if p < n and buf[p] == 45:
        neg = True
        p += 1
    start = p
    v = _U0
    while p < n:
        c = buf[p]
        if c < 48 or c > 57:
            break
        if p - start >= 19:
            return p, 0, False
        v = v * _U10 + np.uint64(c - 48)
        p += 1
    nd = p - start
    if nd == 0:
        return p, 0, False
    if quoted:
        if p >= n or buf[p] != 34:
            return p, 0, False
        p += 1
    else:
        if nd > 1 and buf[start] == 48:  # JSON has no leading zeros
            return p, 0, False
        if p < n and (buf[p] == 46 or buf[p] == 101 or buf[p] == 69):  # a float: the Arrow path
            return p, 0, False
    if neg:
        if v > _TOP:
            return p, 0, False
        if v == _TOP:
            return p, -9223372036854775807 - 1, True
        return p, -np.int64(v), True
    if v >= _TOP:
        return p, 0, False
    return p, np.int64(v), True


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _hard(hard, hn, start, end, kind, i, j):
    """Note a number for the caller to convert (``hard[:, k]`` = start, end, kind, i, j)."""
    k = hn[0]
    if k >= hard.shape[1]:
        return False
    hard[0, k] = start
    hard[1, k] = end
    hard[2, k] = kind
    hard[3, k] = i
    hard[4, k] = j
    hn[0] = k + 1
    return True


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _null(buf, p, n):
    """Whether ``buf[p:p+4]`` is ``null``."""
    return p + 4 <= n and buf[p] == 110 and buf[p + 1] == 117 and buf[p + 2] == 108 and buf[p + 3] == 108


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _key(buf, p, n, keys, lens, guess):
    """The field number of the key string at ``buf[p]`` (an opening quote): (position after the
    closing quote, field, ok); field -1 = not a known key.

    The key expected next (``guess``: the export writes them in one order) is tried first,
    byte by byte against the text with its closing quote, in one pass; the keys hold no quote
    or backslash, so equal bytes followed by a quote are that key.  Otherwise the key is
    scanned to its closing quote and looked up."""
    p += 1
    start = p
    ln = lens[guess]
    if start + ln < n and buf[start + ln] == 34:
        same = True
        for i in range(ln):
            if buf[start + i] != keys[guess, i]:
                same = False
                break
        if same:
            return start + ln + 1, guess, True
    while p < n:
        c = buf[p]
        if c == 34:
            break
        if c == 92 or c == 10:  # an escape, or the line ends inside the key
            return p, -1, False
        p += 1
    if p >= n:
        return p, -1, False
    ln = p - start
    nk = lens.shape[0]
    for j in range(nk):
        f = guess + j
        if f >= nk:
            f -= nk
        if lens[f] != ln:
            continue
        same = True
        for i in range(ln):
            if buf[start + i] != keys[f, i]:
                same = False
                break
        if same:
            return p + 1, f, True
    return p + 1, -1, True


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _res(buf, p, n, row, k, res, res_ok, hi_t, lo_t, hard, hn):
    """A usage object ``{"cpus":..,"memory":..}`` at ``buf[p]`` ('{'); position after it, or -1."""
    p = _ws(buf, p + 1, n)
    if p < n and buf[p] == 125:
        return p + 1
    seen = 0
    while True:
        if p >= n or buf[p] != 34:
            return -1
        # "cpus" or "memory"
        if (
            p + 6 <= n
            and buf[p + 1] == 99
            and buf[p + 2] == 112
            and buf[p + 3] == 117
            and buf[p + 4] == 115
            and buf[p + 5] == 34
        ):
            sub = 0
            p += 6
        elif (
            p + 8 <= n
            and buf[p + 1] == 109
            and buf[p + 2] == 101
            and buf[p + 3] == 109
            and buf[p + 4] == 111
            and buf[p + 5] == 114
            and buf[p + 6] == 121
            and buf[p + 7] == 34
        ):
            sub = 1
            p += 8
        else:
            return -1
        if seen & (1 << sub):
            return -1
        seen |= 1 << sub
        p = _ws(buf, p, n)
        if p >= n or buf[p] != 58:
            return -1
        p = _ws(buf, p + 1, n)
        if _null(buf, p, n):
            p += 4
        else:
            start = p
            p, v, st = _number(buf, p, n, hi_t, lo_t)
            if st == NUM_BAD or (st == NUM_HARD and not _hard(hard, hn, start, p, HARD_RES, 2 * k + sub, row)):
                return -1
            res[2 * k + sub, row] = v
            res_ok[2 * k + sub, row] = 1
        p = _ws(buf, p, n)
        if p >= n:
            return -1
        c = buf[p]
        if c == 125:
            return p + 1
        if c != 44:
            return -1
        p = _ws(buf, p + 1, n)


@njit(cache=True, nogil=True, _nrt=False)
def parse_usage(
    buf, keys, lens, hi_t, lo_t, ints, int_ok, res, res_ok, obj_ok, flt, flt_ok, lvals, loffs, list_ok, hard, hn
):
    """Parse a piece of InstanceUsage lines into the column arrays: (status, rows).  Numbers
    noted in ``hard[:, :hn[0]]`` still need their value (0.0 in place)."""
    n = buf.shape[0]
    cap = ints.shape[1]
    lcap = lvals.shape[1]
    nk = lens.shape[0]
    pos = 0
    row = 0
    loffs[0, 0] = 0
    loffs[1, 0] = 0
    while pos < n:
        p = _ws(buf, pos, n)
        if p >= n or buf[p] == 10:
            return BLANK, row
        if buf[p] != 123 or row >= cap:
            return BAD, row
        fill0 = loffs[0, row]
        fill1 = loffs[1, row]
        p = _ws(buf, p + 1, n)
        seen = 0
        guess = 0
        if p < n and buf[p] == 125:
            p += 1
        else:
            while True:
                if p >= n or buf[p] != 34:
                    return BAD, row
                p, f, ok = _key(buf, p, n, keys, lens, guess)
                if not ok or f < 0:
                    return BAD, row
                if seen & (1 << f):
                    return BAD, row
                seen |= 1 << f
                guess = f + 1 if f + 1 < nk else 0
                p = _ws(buf, p, n)
                if p >= n or buf[p] != 58:
                    return BAD, row
                p = _ws(buf, p + 1, n)
                if p >= n:
                    return BAD, row
                if _null(buf, p, n):
                    p += 4
                elif f < 8:
                    p, iv, ok = _int(buf, p, n)
                    if not ok:
                        return BAD, row
                    ints[f, row] = iv
                    int_ok[f, row] = 1
                elif f < 11:
                    if buf[p] != 123:
                        return BAD, row
                    p = _res(buf, p, n, row, f - 8, res, res_ok, hi_t, lo_t, hard, hn)
                    if p < 0:
                        return BAD, row
                    obj_ok[f - 8, row] = 1
                elif f < 16:
                    start = p
                    p, v, st = _number(buf, p, n, hi_t, lo_t)
                    if st == NUM_BAD:
                        return BAD, row
                    if st == NUM_HARD and not _hard(hard, hn, start, p, HARD_FLT, f - 11, row):
                        return ROOM, row
                    flt[f - 11, row] = v
                    flt_ok[f - 11, row] = 1
                else:
                    li = f - 16
                    if buf[p] != 91:
                        return BAD, row
                    fill = fill0 if li == 0 else fill1
                    p = _ws(buf, p + 1, n)
                    if p < n and buf[p] == 93:
                        p += 1
                    else:
                        while True:
                            start = p
                            p, v, st = _number(buf, p, n, hi_t, lo_t)
                            if st == NUM_BAD:
                                return BAD, row
                            if fill >= lcap:
                                return ROOM, row
                            if st == NUM_HARD and not _hard(hard, hn, start, p, HARD_LIST, li, fill):
                                return ROOM, row
                            lvals[li, fill] = v
                            fill += 1
                            p = _ws(buf, p, n)
                            if p >= n:
                                return BAD, row
                            c = buf[p]
                            if c == 93:
                                p += 1
                                break
                            if c != 44:
                                return BAD, row
                            p = _ws(buf, p + 1, n)
                    if li == 0:
                        fill0 = fill
                    else:
                        fill1 = fill
                    list_ok[li, row] = 1
                p = _ws(buf, p, n)
                if p >= n:
                    return BAD, row
                c = buf[p]
                if c == 125:
                    p += 1
                    break
                if c != 44:
                    return BAD, row
                p = _ws(buf, p + 1, n)
        loffs[0, row + 1] = fill0
        loffs[1, row + 1] = fill1
        p = _ws(buf, p, n)
        if p < n:
            if buf[p] != 10:
                return BAD, row
            p += 1
        pos = p
        row += 1
    return OK, row


@njit(cache=True, nogil=True, _nrt=False)
def parse_numbers(buf, starts, ends, hi_t, lo_t, out, ok):
    """Each ``buf[starts[i]:ends[i]]`` as a whole JSON number, the way the reader converts it
    (``ok[i]`` 0 where the reader would hand the piece to Arrow); for tests and measurements."""
    for i in range(starts.shape[0]):
        p, v, st = _number(buf, starts[i], ends[i], hi_t, lo_t)
        if st == NUM_OK and p == ends[i]:
            out[i] = v
            ok[i] = 1
