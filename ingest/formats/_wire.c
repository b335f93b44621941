/* A batch of TFRecord records holding tf.train.Example (or SequenceExample) messages, scanned in one call for the
 * features a source reads: where each one-value feature's bytes lie in its record, or its number, without a
 * Python object per record or per feature. ingest/formats/tfrecord.py's per-record parse (protobuf) stays the
 * reference and the fallback: this scan takes the canonical encoding only, and a record it does not take (status
 * 1) goes to protobuf, which reads it or names what is wrong with it. tests/test_tfrecord_scan.py checks that the
 * two agree on written, real and mutated records.
 *
 * Protobuf's wire format: a message is fields, each a varint tag (field number << 3 | wire type) and a value:
 * wire type 0 a varint, 1 eight bytes, 2 a varint length and that many bytes, 5 four bytes. The messages
 * (tensorflow/core/example/{example,feature}.proto, proto3):
 *     Example { Features features = 1; }      SequenceExample { Features context = 1; FeatureLists ... = 2; }
 *     Features { map<string, Feature> feature = 1; }   a map entry: { string key = 1; Feature value = 2; }
 *     Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
 *     BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1 [packed]; }
 *     Int64List { repeated int64 value = 1 [packed]; }
 * A record is taken (status 0) when every message parses, nothing is given twice where protobuf would merge or
 * override (Example.features, a map entry's key or value, a Feature's list, a requested key), every map key is
 * UTF-8 (proto3 strings) and every requested feature holds what its kind asks for. Unknown fields of wire types
 * 0, 1, 2 and 5 are skipped, as protobuf does; groups, a known field of another wire type or anything malformed
 * send the record to protobuf.
 *
 * CRCs: given `crc` (the address of the crc32c package's own CRC32C function, found and checked against
 * crc32c.crc32c by ingest/formats/tfrecord.py), the masked CRCs of every record's length and data are checked
 * here, and a record whose CRCs disagree is status 1 (protobuf's path then names the bad CRC). The batch is then
 * checksummed on up to CRC_THREADS native threads and scanned with the GIL released once (a 256-record batch of
 * 80 KB images is ~20 MB to checksum: ~2 ms on one core, which made the read stage of the training process the
 * slowest stage on an H100); without CRCs the scan takes tens of microseconds and keeps the GIL (see
 * ingest/decode/_jpeg.c for why short native calls keep it).
 *
 * examples(records, keys, kinds, out, side, crc) -> int
 *   records  a sequence of n contiguous byte buffers, each one whole framed TFRecord record
 *   keys     a sequence of m bytes: the feature keys
 *   kinds    bytes of m codes: b'b' one bytes value, b'i' one int64, b'f' one float, b'I' an int64 list,
 *            b'F' a float list
 *   out      writable int64 buffer of n * (5 + 2m): per record status (0 taken, 1 not), data length, stored
 *            masked CRC of the length, stored masked CRC of the data, 0; then per key two values:
 *              b: offset in the record, length;  i: the value, 0;  f: the value as float64 bits, 0;
 *              I, F: where the values start in `side`, their count (F: float64 bits)
 *   side     writable int64 buffer for list values; a batch that does not fit takes its remaining records as
 *            status 1
 *   crc      0 (CRCs not checked here), or the address of uint32_t f(uint32_t crc, const uint8_t *data,
 *            size_t n) with crc32c(data) == f(0xFFFFFFFF, data, n) ^ 0xFFFFFFFF
 *   returns  the number of side values used
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define HEAD 5       /* columns before the keys' */
#define MAX_KEYS 64
#define FRAMING 16   /* uint64 length, uint32 CRC, data, uint32 CRC */
#define CRC_THREADS 4
#define CRC_PER_THREAD 16   /* records per checksumming thread at least: fewer are not worth a thread */

enum { OK = 0, BAIL = 1 };

typedef struct {
    const unsigned char *p, *end;
} span;

static int varint(span *s, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (s->p >= s->end)
            return BAIL;
        unsigned char b = *s->p++;
        if (shift == 63 && b > 1)
            return BAIL;   /* more than 64 bits */
        x |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return OK;
        }
    }
    return BAIL;
}

/* The next field's number, wire type and value: `x` for wire type 0, the bytes in `value` for the others. */
static int next_field(span *s, uint32_t *number, int *wire, span *value, uint64_t *x) {
    uint64_t tag;
    if (varint(s, &tag) != OK || (tag >> 3) == 0 || (tag >> 3) > 0x1FFFFFFF)
        return BAIL;
    *number = (uint32_t)(tag >> 3);
    *wire = (int)(tag & 7);
    uint64_t len;
    switch (*wire) {
    case 0:
        return varint(s, x);
    case 1:
    case 5: {
        Py_ssize_t size = *wire == 1 ? 8 : 4;
        if (s->end - s->p < size)
            return BAIL;
        value->p = s->p;
        s->p += size;
        value->end = s->p;
        return OK;
    }
    case 2:
        if (varint(s, &len) != OK || len > (uint64_t)(s->end - s->p))
            return BAIL;
        value->p = s->p;
        value->end = s->p + len;
        s->p = value->end;
        return OK;
    default:   /* groups (3, 4), invalid (6, 7) */
        return BAIL;
    }
}

/* Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF), as protobuf checks proto3 strings. */
static int utf8(const unsigned char *p, const unsigned char *end) {
    while (p < end) {
        unsigned char c = *p++;
        if (c < 0x80)
            continue;
        int more;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF)
            more = 1, cp = c & 0x1F, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF)
            more = 2, cp = c & 0x0F, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4)
            more = 3, cp = c & 0x07, min = 0x10000;
        else
            return BAIL;
        if (end - p < more)
            return BAIL;
        for (int k = 0; k < more; k++) {
            if ((p[k] & 0xC0) != 0x80)
                return BAIL;
            cp = cp << 6 | (p[k] & 0x3F);
        }
        p += more;
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return BAIL;
    }
    return OK;
}

typedef struct {
    int64_t *side;
    Py_ssize_t cap, used;
} sidebuf;

static int side_put(sidebuf *sb, int64_t v) {
    if (sb->used >= sb->cap)
        return BAIL;
    sb->side[sb->used++] = v;
    return OK;
}

static int64_t float_bits(const unsigned char *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, 4);
    double d = f;
    int64_t bits;
    memcpy(&bits, &d, 8);
    return bits;
}

/* One list message (a Feature's bytes_list 1, float_list 2 or int64_list 3): every value checked; with `want`
 * (the kind code of a requested key, 0 for none) its values go to `cell` (two int64) and, for lists, `sb`. */
static int scan_list(span s, uint32_t list, char want, const unsigned char *base, int64_t *cell, sidebuf *sb) {
    int64_t count = 0;
    int64_t start = sb->used;
    span v;
    uint32_t number;
    int wire;
    uint64_t x;
    while (s.p < s.end) {
        if (next_field(&s, &number, &wire, &v, &x) != OK)
            return BAIL;
        if (number != 1)
            continue;   /* an unknown field */
        if (list == 1) {   /* bytes */
            if (wire != 2)
                return BAIL;
            if (want == 'b' && count == 0) {
                cell[0] = v.p - base;
                cell[1] = v.end - v.p;
            }
            count++;
        } else if (list == 2) {   /* float: packed (2) or one value (5) */
            if ((wire != 2 && wire != 5) || (v.end - v.p) % 4)
                return BAIL;
            for (const unsigned char *q = v.p; q < v.end; q += 4, count++) {
                if (want == 'f' && count == 0)
                    cell[0] = float_bits(q);
                else if (want == 'F' && side_put(sb, float_bits(q)) != OK)
                    return BAIL;
            }
        } else {   /* int64: packed (2) or one value (0) */
            if (wire != 0 && wire != 2)
                return BAIL;
            int packed = wire == 2;
            while (!packed || v.p < v.end) {
                if (packed && varint(&v, &x) != OK)
                    return BAIL;
                if (want == 'i' && count == 0)
                    cell[0] = (int64_t)x;
                else if (want == 'I' && side_put(sb, (int64_t)x) != OK)
                    return BAIL;
                count++;
                if (!packed)
                    break;
            }
        }
    }
    if (want == 'I' || want == 'F') {
        cell[0] = start;
        cell[1] = count;
    } else if (want && count != 1) {
        return BAIL;   /* a one-value kind: protobuf's path says what is wrong */
    }
    return OK;
}

/* One Feature message; `want` as for scan_list. A Feature with no list holds an empty list of any type. */
static int scan_feature(span s, char want, const unsigned char *base, int64_t *cell, sidebuf *sb) {
    span v, list = {NULL, NULL};
    uint32_t number, which = 0;
    int wire;
    uint64_t x;
    while (s.p < s.end) {
        if (next_field(&s, &number, &wire, &v, &x) != OK)
            return BAIL;
        if (number < 1 || number > 3)
            continue;
        if (wire != 2 || which)
            return BAIL;   /* a second list: protobuf merges or switches the oneof */
        which = number;
        list = v;
    }
    uint32_t expect = want == 'b' ? 1 : (want == 'f' || want == 'F') ? 2 : (want == 'i' || want == 'I') ? 3 : 0;
    if (!which) {
        if (want == 'I' || want == 'F') {
            cell[0] = sb->used;
            cell[1] = 0;
            return OK;
        }
        return want ? BAIL : OK;
    }
    if (want && which != expect)
        return BAIL;
    return scan_list(list, which, want, base, cell, sb);
}

typedef struct {
    Py_ssize_t m;
    const char *keys[MAX_KEYS];
    Py_ssize_t lens[MAX_KEYS];
    const char *kinds;
} request;

typedef uint32_t (*crc_fn)(uint32_t crc, const unsigned char *data, size_t n);

/* TFRecord's masked CRC32C of [p, p + n). */
static uint32_t masked_crc(crc_fn crc, const unsigned char *p, size_t n) {
    uint32_t c = crc(0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu;
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

static uint64_t le64(const unsigned char *p) {
    uint64_t x = 0;
    for (int k = 7; k >= 0; k--)
        x = x << 8 | p[k];
    return x;
}

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* 1 if the record's framing is whole and both its masked CRCs match; 0 otherwise (the scan then bails). */
static int crc_ok(crc_fn crc, const unsigned char *rec, Py_ssize_t n) {
    if (n < FRAMING || le64(rec) != (uint64_t)(n - FRAMING))
        return 0;
    return masked_crc(crc, rec, 8) == le32(rec + 8) && masked_crc(crc, rec + 12, n - FRAMING) == le32(rec + n - 4);
}

typedef struct {
    crc_fn crc;
    const Py_buffer *bufs;
    Py_ssize_t n, next;   /* next: the first record no thread has taken, advanced atomically */
    char *good;
} crc_batch;

static void *crc_worker(void *arg) {
    crc_batch *b = arg;
    Py_ssize_t i;
    while ((i = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED)) < b->n)
        b->good[i] = (char)crc_ok(b->crc, b->bufs[i].buf, b->bufs[i].len);
    return NULL;
}

/* good[i] = crc_ok of record i, on up to CRC_THREADS threads (the caller's one of them). */
static void check_crcs(crc_fn crc, const Py_buffer *bufs, Py_ssize_t n, char *good) {
    crc_batch b = {crc, bufs, n, 0, good};
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long threads = n / CRC_PER_THREAD;
    threads = threads < CRC_THREADS ? threads : CRC_THREADS;
    threads = threads < cores ? threads : cores;
    pthread_t ids[CRC_THREADS];
    long started = 0;
    for (; started + 1 < threads; started++)
        if (pthread_create(&ids[started], NULL, crc_worker, &b) != 0)
            break;   /* fewer threads: the caller does the rest */
    crc_worker(&b);
    for (long t = 0; t < started; t++)
        pthread_join(ids[t], NULL);
}

/* good: 0 where the record's CRCs were checked and disagree (it bails), else 1. */
static int scan_record(const unsigned char *rec, Py_ssize_t n, const request *rq, int64_t *row, sidebuf *sb,
                       int good) {
    memset(row, 0, sizeof(int64_t) * (HEAD + 2 * rq->m));
    row[0] = BAIL;
    if (n < FRAMING)
        return BAIL;
    uint64_t length = le64(rec);
    if (length != (uint64_t)(n - FRAMING))
        return BAIL;
    row[1] = (int64_t)length;
    row[2] = (int64_t)le32(rec + 8);
    row[3] = (int64_t)le32(rec + n - 4);
    if (!good)
        return BAIL;

    span s = {rec + 12, rec + n - 4}, v, features = {NULL, NULL};
    uint32_t number;
    int wire, seen = 0;
    uint64_t x;
    while (s.p < s.end) {   /* Example */
        if (next_field(&s, &number, &wire, &v, &x) != OK)
            return BAIL;
        if (number == 1) {
            if (wire != 2 || seen)
                return BAIL;
            seen = 1;
            features = v;
        } else if (number == 2) {
            return BAIL;   /* a SequenceExample's feature lists: protobuf reads (and checks) those */
        }
    }
    int found[MAX_KEYS] = {0};
    Py_ssize_t left = rq->m;
    s = features;
    while (s.p && s.p < s.end) {   /* Features: map entries */
        if (next_field(&s, &number, &wire, &v, &x) != OK)
            return BAIL;
        if (number != 1)
            continue;
        if (wire != 2)
            return BAIL;
        span e = v, key = {(const unsigned char *)"", (const unsigned char *)""}, value = {NULL, NULL}, f;
        int has_key = 0, has_value = 0;
        while (e.p < e.end) {
            if (next_field(&e, &number, &wire, &f, &x) != OK)
                return BAIL;
            if (number == 1 || number == 2) {
                if (wire != 2 || (number == 1 ? has_key : has_value))
                    return BAIL;
                if (number == 1)
                    has_key = 1, key = f;
                else
                    has_value = 1, value = f;
            }
        }
        if (utf8(key.p, key.end) != OK)
            return BAIL;
        Py_ssize_t klen = key.end - key.p;
        Py_ssize_t k = 0;
        while (k < rq->m && !(rq->lens[k] == klen && memcmp(rq->keys[k], key.p, klen) == 0))
            k++;
        char want = 0;
        int64_t scratch[2];
        int64_t *cell = scratch;
        if (k < rq->m) {
            if (found[k])
                return BAIL;   /* a key given twice: the last one wins in protobuf */
            found[k] = 1;
            left--;
            want = rq->kinds[k];
            cell = row + HEAD + 2 * k;
        }
        if (value.p && scan_feature(value, want, rec, cell, sb) != OK)
            return BAIL;
        if (!value.p && want && want != 'I' && want != 'F')
            return BAIL;
        if (!value.p && want) {
            cell[0] = sb->used;
            cell[1] = 0;
        }
    }
    if (left)
        return BAIL;   /* a requested key is missing */
    row[0] = OK;
    return OK;
}

static PyObject *examples(PyObject *self, PyObject *args) {
    PyObject *records, *keys;
    Py_buffer kinds, out, side;
    unsigned long long crc_address;
    if (!PyArg_ParseTuple(args, "OOy*w*w*K", &records, &keys, &kinds, &out, &side, &crc_address))
        return NULL;
    PyObject *result = NULL, *rseq = NULL, *kseq = NULL;
    Py_buffer *bufs = NULL;
    Py_ssize_t got = 0;
    request rq;
    rseq = PySequence_Fast(records, "records must be a sequence");
    kseq = rseq ? PySequence_Fast(keys, "keys must be a sequence") : NULL;
    if (!kseq)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(rseq);
    rq.m = PySequence_Fast_GET_SIZE(kseq);
    rq.kinds = kinds.buf;
    if (rq.m > MAX_KEYS || kinds.len != rq.m) {
        PyErr_Format(PyExc_ValueError, "need at most %d keys and one kind per key", MAX_KEYS);
        goto done;
    }
    for (Py_ssize_t k = 0; k < rq.m; k++) {
        char *p;
        if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(kseq, k), &p, &rq.lens[k]) < 0)
            goto done;
        rq.keys[k] = p;
        if (rq.kinds[k] == 0 || !strchr("bifIF", rq.kinds[k])) {
            PyErr_Format(PyExc_ValueError, "unknown kind code %c", rq.kinds[k]);
            goto done;
        }
    }
    Py_ssize_t width = HEAD + 2 * rq.m;
    if (out.len < (Py_ssize_t)sizeof(int64_t) * n * width) {
        PyErr_SetString(PyExc_ValueError, "out is too small");
        goto done;
    }
    bufs = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    if (!bufs) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < n; got++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(rseq, got), &bufs[got], PyBUF_SIMPLE) < 0)
            goto done;
    sidebuf sb = {side.buf, side.len / (Py_ssize_t)sizeof(int64_t), 0};
    crc_fn crc = (crc_fn)(uintptr_t)crc_address;
    char *good = NULL;
    if (crc && !(good = PyMem_Malloc(n ? n : 1))) {
        PyErr_NoMemory();
        goto done;
    }
    PyThreadState *saved = crc ? PyEval_SaveThread() : NULL;   /* only a checksummed batch is long */
    if (crc)
        check_crcs(crc, bufs, n, good);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t mark = sb.used;
        if (scan_record(bufs[i].buf, bufs[i].len, &rq, (int64_t *)out.buf + i * width, &sb, good ? good[i] : 1) != OK)
            sb.used = mark;   /* a record not taken leaves no values behind */
    }
    if (saved)
        PyEval_RestoreThread(saved);
    PyMem_Free(good);
    result = PyLong_FromSsize_t(sb.used);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&bufs[i]);
    PyMem_Free(bufs);
    Py_XDECREF(rseq);
    Py_XDECREF(kseq);
    PyBuffer_Release(&kinds);
    PyBuffer_Release(&out);
    PyBuffer_Release(&side);
    return result;
}

static PyMethodDef methods[] = {
    {"examples", examples, METH_VARARGS, "Scan a batch of framed tf.train.Example records (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_wire", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__wire(void) { return PyModule_Create(&module); }
