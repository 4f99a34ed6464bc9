/* The compiled InstanceUsage JSON reader as a C extension, built when the package is built or
 * installed (setup.py: an optional extension, so an install without a C compiler still works and
 * gpuclust/ingest/readers/_fast_usage.py falls back to numba's kernel, then to Arrow's reader).
 *
 * A line-for-line port of gpuclust/ingest/readers/_fast_usage_kernel.py (the numba kernel):
 * same arguments, same result, same refusals.  tests/ingest/test_fast_usage.py reads every test
 * input with this kernel, with numba's and with Arrow's reader and compares every column bit for
 * bit.  Field numbers follow _fast_usage.KEYS: 0-7 INT64 fields, 8-10 the usage objects, 11-15
 * the plain floats, 16-17 the percentile arrays.
 *
 * parse_usage(buf, keys, lens, hi, lo, ints, int_ok, res, res_ok, obj_ok, flt, flt_ok, lvals,
 *             loffs, list_ok, hard, hn) -> (status, rows)
 * parse_numbers(buf, starts, ends, hi, lo, out, ok) -> None
 *
 * Every argument is a C-contiguous NumPy array (or other buffer) of the kernel's dtype; the GIL is
 * released while a piece is parsed, so pieces are parsed in several threads.  Floating point: one
 * IEEE multiply or divide (Clinger's fast path) or an exact ldexp (Eisel-Lemire), as in the numba
 * kernel; built with -ffp-contract=off so that no fused operation changes a rounding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#define OK 0
#define BAD 1
#define BLANK 2
#define ROOM 3
#define NUM_OK 0
#define NUM_HARD 1
#define NUM_BAD 2
#define HARD_RES 0
#define HARD_FLT 1
#define HARD_LIST 2
/* Decimal exponents of the Eisel-Lemire table (_pow10.POW_MIN, POW_MAX). */
#define POW_MIN (-342)
#define POW_MAX 308

static const double P10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

typedef struct {
    const uint8_t *buf;
    int64_t n;
    const uint64_t *hi_t, *lo_t;
} Text;

typedef struct {
    int64_t *hard; /* (5, hcap) */
    int64_t hcap;
    int64_t *hn;
} Hard;

static inline int64_t ws(const uint8_t *buf, int64_t p, int64_t n) {
    while (p < n) {
        uint8_t c = buf[p];
        if (c == 32 || c == 9 || c == 13)
            p++;
        else
            break;
    }
    return p;
}

static inline void mul128(uint64_t a, uint64_t b, uint64_t *hi, uint64_t *lo) {
    const uint64_t M32 = 0xFFFFFFFFull;
    uint64_t a_lo = a & M32, a_hi = a >> 32, b_lo = b & M32, b_hi = b >> 32;
    uint64_t p0 = a_lo * b_lo, p1 = a_lo * b_hi, p2 = a_hi * b_lo, p3 = a_hi * b_hi;
    uint64_t mid = (p0 >> 32) + (p1 & M32) + (p2 & M32);
    *lo = (p0 & M32) | (mid << 32);
    *hi = p3 + (p1 >> 32) + (p2 >> 32) + (mid >> 32);
}

static inline int clz64(uint64_t x) {
    int n = 0;
    if (x == 0) return 64;
    while ((x & (1ull << 63)) == 0) {
        x <<= 1;
        n++;
    }
    return n;
}

/* The double nearest to man * 10^e10 (man > 0); 0 when not decided here. */
static int eisel_lemire(uint64_t man, int64_t e10, const uint64_t *hi_t, const uint64_t *lo_t, double *out) {
    if (e10 < POW_MIN || e10 > POW_MAX) return 0;
    int clz = clz64(man);
    man <<= clz;
    /* floor division by 2^16 of a possibly negative product (an arithmetic shift, as numba's) */
    int64_t prod = 217706 * e10;
    int64_t ret_exp2 = (prod >= 0 ? prod / 65536 : -((-prod + 65535) / 65536)) + 64 + 1023 - clz;
    uint64_t t_hi = hi_t[e10 - POW_MIN], t_lo = lo_t[e10 - POW_MIN];
    uint64_t x_hi, x_lo;
    mul128(man, t_hi, &x_hi, &x_lo);
    const uint64_t LOW9 = 0x1FF;
    if ((x_hi & LOW9) == LOW9 && x_lo + man < man) {
        uint64_t y_hi, y_lo;
        mul128(man, t_lo, &y_hi, &y_lo);
        uint64_t m_hi = x_hi, m_lo = x_lo + y_hi;
        if (m_lo < x_lo) m_hi += 1;
        if ((m_hi & LOW9) == LOW9 && m_lo + 1 == 0 && y_lo + man < man) return 0;
        x_hi = m_hi;
        x_lo = m_lo;
    }
    uint64_t msb = x_hi >> 63;
    uint64_t ret_man = x_hi >> (msb + 9);
    ret_exp2 -= (int64_t)(1 ^ msb);
    if (x_lo == 0 && (x_hi & LOW9) == 0 && (ret_man & 3) == 1) return 0;
    ret_man += ret_man & 1;
    ret_man >>= 1;
    if ((ret_man >> 53) > 0) {
        ret_man >>= 1;
        ret_exp2 += 1;
    }
    if (ret_exp2 <= 0 || ret_exp2 >= 0x7FF) return 0;
    /* ret_man holds 53 bits (the implicit one included): exact in a double */
    *out = ldexp((double)ret_man, (int)(ret_exp2 - 1075));
    return 1;
}

/* A JSON number at buf[p]: the position after it; *v its value, *st NUM_OK, NUM_HARD (valid, not
 * converted here) or NUM_BAD (not a JSON number). */
static inline int64_t number(const Text *t, int64_t p, int64_t n, double *v, int *st) {
    const uint8_t *buf = t->buf;
    int neg = 0;
    *v = 0.0;
    if (p < n && buf[p] == 45) {
        neg = 1;
        p++;
    }
    if (p >= n) {
        *st = NUM_BAD;
        return p;
    }
    uint8_t c = buf[p];
    uint64_t man = 0;
    int nd = 0;
    int64_t e10 = 0;
    int dropped = 0;
    if (c == 48) {
        p++;
        if (p < n && buf[p] >= 48 && buf[p] <= 57) {
            *st = NUM_BAD;
            return p;
        }
    } else if (c >= 49 && c <= 57) {
        while (p < n) {
            c = buf[p];
            if (c < 48 || c > 57) break;
            if (nd < 19) {
                man = man * 10 + (uint64_t)(c - 48);
                nd++;
            } else {
                dropped = 1;
            }
            p++;
        }
    } else {
        *st = NUM_BAD;
        return p;
    }
    if (p < n && buf[p] == 46) {
        p++;
        int64_t start = p;
        while (p < n) {
            c = buf[p];
            if (c < 48 || c > 57) break;
            if (man == 0 && c == 48) {
                e10 -= 1;
            } else if (nd < 19) {
                man = man * 10 + (uint64_t)(c - 48);
                nd++;
                e10 -= 1;
            } else {
                dropped = 1;
            }
            p++;
        }
        if (p == start) {
            *st = NUM_BAD;
            return p;
        }
    }
    if (p < n && (buf[p] == 101 || buf[p] == 69)) {
        p++;
        int eneg = 0;
        if (p < n && (buf[p] == 43 || buf[p] == 45)) {
            eneg = buf[p] == 45;
            p++;
        }
        int64_t start = p, ex = 0;
        while (p < n) {
            c = buf[p];
            if (c < 48 || c > 57) break;
            if (ex < 100000) ex = ex * 10 + (c - 48);
            p++;
        }
        if (p == start) {
            *st = NUM_BAD;
            return p;
        }
        e10 += eneg ? -ex : ex;
    }
    if (dropped) {
        *st = NUM_HARD;
        return p;
    }
    if (man == 0) {
        *v = neg ? -0.0 : 0.0;
        *st = NUM_OK;
        return p;
    }
    double x;
    if (man <= (1ull << 53) && e10 >= -22 && e10 <= 22) {
        x = (double)man;
        if (e10 >= 0)
            x = x * P10[e10];
        else
            x = x / P10[-e10];
    } else if (!eisel_lemire(man, e10, t->hi_t, t->lo_t, &x)) {
        *st = NUM_HARD;
        return p;
    }
    *v = neg ? -x : x;
    *st = NUM_OK;
    return p;
}

/* An INT64 field at buf[p]: quoted -?[0-9]{1,19} or an unquoted JSON integer. */
static inline int64_t int_field(const uint8_t *buf, int64_t p, int64_t n, int64_t *out, int *ok) {
    *ok = 0;
    *out = 0;
    int quoted = buf[p] == 34;
    if (quoted) p++;
    int neg = 0;
    if (p < n && buf[p] == 45) {
        neg = 1;
        p++;
    }
    int64_t start = p;
    uint64_t v = 0;
    while (p < n) {
        uint8_t c = buf[p];
        if (c < 48 || c > 57) break;
        if (p - start >= 19) return p;
        v = v * 10 + (uint64_t)(c - 48);
        p++;
    }
    int64_t nd = p - start;
    if (nd == 0) return p;
    if (quoted) {
        if (p >= n || buf[p] != 34) return p;
        p++;
    } else {
        if (nd > 1 && buf[start] == 48) return p; /* JSON has no leading zeros */
        if (p < n && (buf[p] == 46 || buf[p] == 101 || buf[p] == 69)) return p; /* a float: the Arrow path */
    }
    const uint64_t TOP = 1ull << 63;
    if (neg) {
        if (v > TOP) return p;
        *out = v == TOP ? INT64_MIN : -(int64_t)v;
        *ok = 1;
        return p;
    }
    if (v >= TOP) return p;
    *out = (int64_t)v;
    *ok = 1;
    return p;
}

/* Note a number for the caller to convert (hard[:, k] = start, end, kind, i, j). */
static inline int note_hard(const Hard *h, int64_t start, int64_t end, int64_t kind, int64_t i, int64_t j) {
    int64_t k = h->hn[0];
    if (k >= h->hcap) return 0;
    h->hard[0 * h->hcap + k] = start;
    h->hard[1 * h->hcap + k] = end;
    h->hard[2 * h->hcap + k] = kind;
    h->hard[3 * h->hcap + k] = i;
    h->hard[4 * h->hcap + k] = j;
    h->hn[0] = k + 1;
    return 1;
}

static inline int is_null(const uint8_t *buf, int64_t p, int64_t n) {
    return p + 4 <= n && buf[p] == 110 && buf[p + 1] == 117 && buf[p + 2] == 108 && buf[p + 3] == 108;
}

/* The field number of the key string at buf[p] (an opening quote): the position after the closing
 * quote; *f = -1 for an unknown key, *ok = 0 for a malformed one. */
static inline int64_t key(const uint8_t *buf, int64_t p, int64_t n, const uint8_t *keys, int64_t kw,
                          const int64_t *lens, int64_t nk, int64_t guess, int64_t *f, int *ok) {
    p++;
    int64_t start = p;
    int64_t ln = lens[guess];
    if (start + ln < n && buf[start + ln] == 34 && memcmp(buf + start, keys + guess * kw, (size_t)ln) == 0) {
        *f = guess;
        *ok = 1;
        return start + ln + 1;
    }
    while (p < n) {
        uint8_t c = buf[p];
        if (c == 34) break;
        if (c == 92 || c == 10) { /* an escape, or the line ends inside the key */
            *f = -1;
            *ok = 0;
            return p;
        }
        p++;
    }
    if (p >= n) {
        *f = -1;
        *ok = 0;
        return p;
    }
    ln = p - start;
    for (int64_t j = 0; j < nk; j++) {
        int64_t g = guess + j;
        if (g >= nk) g -= nk;
        if (lens[g] != ln) continue;
        if (memcmp(buf + start, keys + g * kw, (size_t)ln) == 0) {
            *f = g;
            *ok = 1;
            return p + 1;
        }
    }
    *f = -1;
    *ok = 1;
    return p + 1;
}

/* A usage object {"cpus":..,"memory":..} at buf[p] ('{'): the position after it, or -1. */
static inline int64_t res_object(const Text *t, int64_t p, int64_t row, int64_t k, float *res, uint8_t *res_ok,
                                 int64_t cap, const Hard *h) {
    const uint8_t *buf = t->buf;
    int64_t n = t->n;
    p = ws(buf, p + 1, n);
    if (p < n && buf[p] == 125) return p + 1;
    int seen = 0;
    for (;;) {
        int sub;
        if (p >= n || buf[p] != 34) return -1;
        if (p + 6 <= n && memcmp(buf + p + 1, "cpus\"", 5) == 0) {
            sub = 0;
            p += 6;
        } else if (p + 8 <= n && memcmp(buf + p + 1, "memory\"", 7) == 0) {
            sub = 1;
            p += 8;
        } else {
            return -1;
        }
        if (seen & (1 << sub)) return -1;
        seen |= 1 << sub;
        p = ws(buf, p, n);
        if (p >= n || buf[p] != 58) return -1;
        p = ws(buf, p + 1, n);
        if (is_null(buf, p, n)) {
            p += 4;
        } else {
            int64_t start = p;
            double v;
            int st;
            p = number(t, p, n, &v, &st);
            if (st == NUM_BAD || (st == NUM_HARD && !note_hard(h, start, p, HARD_RES, 2 * k + sub, row))) return -1;
            res[(2 * k + sub) * cap + row] = (float)v;
            res_ok[(2 * k + sub) * cap + row] = 1;
        }
        p = ws(buf, p, n);
        if (p >= n) return -1;
        uint8_t c = buf[p];
        if (c == 125) return p + 1;
        if (c != 44) return -1;
        p = ws(buf, p + 1, n);
    }
}

typedef struct {
    const uint8_t *keys;
    int64_t nk, kw;
    const int64_t *lens;
    int64_t *ints;
    uint8_t *int_ok;
    float *res;
    uint8_t *res_ok, *obj_ok;
    float *flt;
    uint8_t *flt_ok;
    int64_t cap;
    float *lvals;
    int64_t lcap;
    int32_t *loffs; /* (2, cap + 1) */
    uint8_t *list_ok;
} Columns;

/* Parse a piece of InstanceUsage lines into the column arrays; *rows_out the rows parsed. */
static int parse_usage_impl(const Text *t, const Columns *o, const Hard *h, int64_t *rows_out) {
    const uint8_t *buf = t->buf;
    const int64_t n = t->n, cap = o->cap, lcap = o->lcap, nk = o->nk;
    int64_t pos = 0, row = 0;
    int32_t *loffs0 = o->loffs, *loffs1 = o->loffs + (cap + 1);
#define RETURN(status)   \
    do {                 \
        *rows_out = row; \
        return (status); \
    } while (0)
    loffs0[0] = 0;
    loffs1[0] = 0;
    while (pos < n) {
        int64_t p = ws(buf, pos, n);
        if (p >= n || buf[p] == 10) RETURN(BLANK);
        if (buf[p] != 123 || row >= cap) RETURN(BAD);
        int64_t fill0 = loffs0[row], fill1 = loffs1[row];
        p = ws(buf, p + 1, n);
        int64_t seen = 0, guess = 0;
        if (p < n && buf[p] == 125) {
            p++;
        } else {
            for (;;) {
                int64_t f;
                int ok;
                if (p >= n || buf[p] != 34) RETURN(BAD);
                p = key(buf, p, n, o->keys, o->kw, o->lens, nk, guess, &f, &ok);
                if (!ok || f < 0) RETURN(BAD);
                if (seen & ((int64_t)1 << f)) RETURN(BAD);
                seen |= (int64_t)1 << f;
                guess = f + 1 < nk ? f + 1 : 0;
                p = ws(buf, p, n);
                if (p >= n || buf[p] != 58) RETURN(BAD);
                p = ws(buf, p + 1, n);
                if (p >= n) RETURN(BAD);
                if (is_null(buf, p, n)) {
                    p += 4;
                } else if (f < 8) {
                    int64_t iv;
                    p = int_field(buf, p, n, &iv, &ok);
                    if (!ok) RETURN(BAD);
                    o->ints[f * cap + row] = iv;
                    o->int_ok[f * cap + row] = 1;
                } else if (f < 11) {
                    if (buf[p] != 123) RETURN(BAD);
                    p = res_object(t, p, row, f - 8, o->res, o->res_ok, cap, h);
                    if (p < 0) RETURN(BAD);
                    o->obj_ok[(f - 8) * cap + row] = 1;
                } else if (f < 16) {
                    int64_t start = p;
                    double v;
                    int st;
                    p = number(t, p, n, &v, &st);
                    if (st == NUM_BAD) RETURN(BAD);
                    if (st == NUM_HARD && !note_hard(h, start, p, HARD_FLT, f - 11, row)) RETURN(ROOM);
                    o->flt[(f - 11) * cap + row] = (float)v;
                    o->flt_ok[(f - 11) * cap + row] = 1;
                } else {
                    int64_t li = f - 16;
                    if (buf[p] != 91) RETURN(BAD);
                    int64_t fill = li == 0 ? fill0 : fill1;
                    p = ws(buf, p + 1, n);
                    if (p < n && buf[p] == 93) {
                        p++;
                    } else {
                        for (;;) {
                            int64_t start = p;
                            double v;
                            int st;
                            p = number(t, p, n, &v, &st);
                            if (st == NUM_BAD) RETURN(BAD);
                            if (fill >= lcap) RETURN(ROOM);
                            if (st == NUM_HARD && !note_hard(h, start, p, HARD_LIST, li, fill)) RETURN(ROOM);
                            o->lvals[li * lcap + fill] = (float)v;
                            fill++;
                            p = ws(buf, p, n);
                            if (p >= n) RETURN(BAD);
                            uint8_t c = buf[p];
                            if (c == 93) {
                                p++;
                                break;
                            }
                            if (c != 44) RETURN(BAD);
                            p = ws(buf, p + 1, n);
                        }
                    }
                    if (li == 0)
                        fill0 = fill;
                    else
                        fill1 = fill;
                    o->list_ok[li * cap + row] = 1;
                }
                p = ws(buf, p, n);
                if (p >= n) RETURN(BAD);
                uint8_t c = buf[p];
                if (c == 125) {
                    p++;
                    break;
                }
                if (c != 44) RETURN(BAD);
                p = ws(buf, p + 1, n);
            }
        }
        loffs0[row + 1] = (int32_t)fill0;
        loffs1[row + 1] = (int32_t)fill1;
        p = ws(buf, p, n);
        if (p < n) {
            if (buf[p] != 10) RETURN(BAD);
            p++;
        }
        pos = p;
        row++;
    }
    RETURN(OK);
#undef RETURN
}

/* ------------------------------------------------------------------------------------------ */
/* Python interface                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* The buffers of one call, released together. */
typedef struct {
    Py_buffer views[17];
    int held;
} Views;

static void release(Views *v) {
    for (int i = 0; i < v->held; i++) PyBuffer_Release(&v->views[i]);
    v->held = 0;
}

/* Take obj's buffer as a C-contiguous array of items of `kind` ('u' unsigned, 'i' signed integer,
 * 'f' float) and `size` bytes with `ndim` dimensions; NULL (an exception set) otherwise. */
static Py_buffer *take(Views *v, PyObject *obj, const char *name, char kind, Py_ssize_t size, int ndim,
                       int writable) {
    Py_buffer *b = &v->views[v->held];
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, b, flags) != 0) return NULL;
    v->held++;
    const char *fmt = b->format ? b->format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@' || *fmt == '|') fmt++;
    char c = fmt[0];
    char got = (c == 'f' || c == 'd' || c == 'e') ? 'f' : ((c >= 'A' && c <= 'Z') || c == '?') ? 'u' : 'i';
    if (fmt[1] != '\0' || got != kind || b->itemsize != size || b->ndim != ndim) {
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous %d-d array of %s%d, got format %s, %d-d",
                     name, ndim, kind == 'f' ? "float" : kind == 'u' ? "uint" : "int", (int)(8 * size),
                     b->format ? b->format : "B", b->ndim);
        return NULL;
    }
    return b;
}

static Py_ssize_t dim(const Py_buffer *b, int i) { return b->shape ? b->shape[i] : b->len / b->itemsize; }

static PyObject *py_parse_usage(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[17];
    if (!PyArg_UnpackTuple(args, "parse_usage", 17, 17, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                           &o[8], &o[9], &o[10], &o[11], &o[12], &o[13], &o[14], &o[15], &o[16]))
        return NULL;
    Views v = {.held = 0};
    Py_buffer *buf = take(&v, o[0], "buf", 'u', 1, 1, 0), *keys = NULL, *lens = NULL, *hi = NULL, *lo = NULL,
              *ints = NULL, *int_ok = NULL, *res = NULL, *res_ok = NULL, *obj_ok = NULL, *flt = NULL,
              *flt_ok = NULL, *lvals = NULL, *loffs = NULL, *list_ok = NULL, *hard = NULL, *hn = NULL;
    if (!buf || !(keys = take(&v, o[1], "keys", 'u', 1, 2, 0)) || !(lens = take(&v, o[2], "lens", 'i', 8, 1, 0)) ||
        !(hi = take(&v, o[3], "hi", 'u', 8, 1, 0)) || !(lo = take(&v, o[4], "lo", 'u', 8, 1, 0)) ||
        !(ints = take(&v, o[5], "ints", 'i', 8, 2, 1)) || !(int_ok = take(&v, o[6], "int_ok", 'u', 1, 2, 1)) ||
        !(res = take(&v, o[7], "res", 'f', 4, 2, 1)) || !(res_ok = take(&v, o[8], "res_ok", 'u', 1, 2, 1)) ||
        !(obj_ok = take(&v, o[9], "obj_ok", 'u', 1, 2, 1)) || !(flt = take(&v, o[10], "flt", 'f', 4, 2, 1)) ||
        !(flt_ok = take(&v, o[11], "flt_ok", 'u', 1, 2, 1)) || !(lvals = take(&v, o[12], "lvals", 'f', 4, 2, 1)) ||
        !(loffs = take(&v, o[13], "loffs", 'i', 4, 2, 1)) || !(list_ok = take(&v, o[14], "list_ok", 'u', 1, 2, 1)) ||
        !(hard = take(&v, o[15], "hard", 'i', 8, 2, 1)) || !(hn = take(&v, o[16], "hn", 'i', 8, 1, 1))) {
        release(&v);
        return NULL;
    }
    Py_ssize_t cap = dim(ints, 1), nk = dim(keys, 0);
    /* the shapes _fast_usage._run allocates: anything else would be read or written out of bounds */
    if (dim(ints, 0) != 8 || dim(int_ok, 0) != 8 || dim(int_ok, 1) != cap || dim(res, 0) != 6 ||
        dim(res, 1) != cap || dim(res_ok, 0) != 6 || dim(res_ok, 1) != cap || dim(obj_ok, 0) != 3 ||
        dim(obj_ok, 1) != cap || dim(flt, 0) != 5 || dim(flt, 1) != cap || dim(flt_ok, 0) != 5 ||
        dim(flt_ok, 1) != cap || dim(lvals, 0) != 2 || dim(loffs, 0) != 2 || dim(loffs, 1) != cap + 1 ||
        dim(list_ok, 0) != 2 || dim(list_ok, 1) != cap || dim(hard, 0) != 5 || dim(hn, 0) < 1 || nk < 18 ||
        nk > 62 || dim(lens, 0) != nk || dim(hi, 0) != POW_MAX - POW_MIN + 1 || dim(lo, 0) != dim(hi, 0)) {
        release(&v);
        PyErr_SetString(PyExc_ValueError, "parse_usage: arrays of the wrong shapes");
        return NULL;
    }
    const int64_t *lens_p = (const int64_t *)lens->buf;
    for (Py_ssize_t i = 0; i < nk; i++) {
        if (lens_p[i] < 0 || lens_p[i] > dim(keys, 1)) {
            release(&v);
            PyErr_SetString(PyExc_ValueError, "parse_usage: a key length beyond the key table");
            return NULL;
        }
    }
    Text t = {(const uint8_t *)buf->buf, (int64_t)buf->len, (const uint64_t *)hi->buf, (const uint64_t *)lo->buf};
    Columns cols = {(const uint8_t *)keys->buf,
                    nk,
                    dim(keys, 1),
                    lens_p,
                    (int64_t *)ints->buf,
                    (uint8_t *)int_ok->buf,
                    (float *)res->buf,
                    (uint8_t *)res_ok->buf,
                    (uint8_t *)obj_ok->buf,
                    (float *)flt->buf,
                    (uint8_t *)flt_ok->buf,
                    cap,
                    (float *)lvals->buf,
                    dim(lvals, 1),
                    (int32_t *)loffs->buf,
                    (uint8_t *)list_ok->buf};
    Hard h = {(int64_t *)hard->buf, dim(hard, 1), (int64_t *)hn->buf};
    int64_t rows = 0;
    int status;
    /* clang-format off */
    Py_BEGIN_ALLOW_THREADS
    status = parse_usage_impl(&t, &cols, &h, &rows);
    Py_END_ALLOW_THREADS
    /* clang-format on */
    release(&v);
    return Py_BuildValue("(iL)", status, (long long)rows);
}

static PyObject *py_parse_numbers(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o[7];
    if (!PyArg_UnpackTuple(args, "parse_numbers", 7, 7, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6]))
        return NULL;
    Views v = {.held = 0};
    Py_buffer *buf = take(&v, o[0], "buf", 'u', 1, 1, 0), *starts = NULL, *ends = NULL, *hi = NULL, *lo = NULL,
              *out = NULL, *ok = NULL;
    if (!buf || !(starts = take(&v, o[1], "starts", 'i', 8, 1, 0)) || !(ends = take(&v, o[2], "ends", 'i', 8, 1, 0)) ||
        !(hi = take(&v, o[3], "hi", 'u', 8, 1, 0)) || !(lo = take(&v, o[4], "lo", 'u', 8, 1, 0)) ||
        !(out = take(&v, o[5], "out", 'f', 8, 1, 1)) || !(ok = take(&v, o[6], "ok", 'u', 1, 1, 1))) {
        release(&v);
        return NULL;
    }
    Py_ssize_t m = dim(starts, 0);
    const int64_t *s = (const int64_t *)starts->buf, *e = (const int64_t *)ends->buf;
    int bad = dim(ends, 0) != m || dim(out, 0) != m || dim(ok, 0) != m || dim(hi, 0) != POW_MAX - POW_MIN + 1 ||
              dim(lo, 0) != dim(hi, 0);
    for (Py_ssize_t i = 0; !bad && i < m; i++) bad = s[i] < 0 || s[i] > e[i] || e[i] > buf->len;
    if (bad) {
        release(&v);
        PyErr_SetString(PyExc_ValueError, "parse_numbers: arrays of the wrong shapes or ranges");
        return NULL;
    }
    Text t = {(const uint8_t *)buf->buf, (int64_t)buf->len, (const uint64_t *)hi->buf, (const uint64_t *)lo->buf};
    double *outp = (double *)out->buf;
    uint8_t *okp = (uint8_t *)ok->buf;
    for (Py_ssize_t i = 0; i < m; i++) {
        double x;
        int st;
        int64_t p = number(&t, s[i], e[i], &x, &st);
        if (st == NUM_OK && p == e[i]) {
            outp[i] = x;
            okp[i] = 1;
        }
    }
    release(&v);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"parse_usage", py_parse_usage, METH_VARARGS,
     "parse_usage(buf, keys, lens, hi, lo, ints, int_ok, res, res_ok, obj_ok, flt, flt_ok, lvals, loffs, "
     "list_ok, hard, hn) -> (status, rows): a piece of InstanceUsage lines into the column arrays "
     "(gpuclust/ingest/readers/_fast_usage_kernel.py's parse_usage, compiled at install)."},
    {"parse_numbers", py_parse_numbers, METH_VARARGS,
     "parse_numbers(buf, starts, ends, hi, lo, out, ok): each buf[starts[i]:ends[i]] as a whole JSON number, "
     "as parse_usage converts it (ok[i] stays 0 where the reader would hand the piece to Arrow)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fast_usage_c",
                                    "The compiled InstanceUsage JSON reader (C, built at install).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fast_usage_c(void) { return PyModule_Create(&module); }
