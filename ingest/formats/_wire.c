/* A batch of TFRecord records holding tf.train.Example (or SequenceExample) messages, scanned in one call for the
 * features a source reads: where each one-value feature's bytes lie in its record, or its number, without a
 * Python object per record or per feature. ingest/formats/tfrecord.py's per-record parse (protobuf) stays the
 * reference and the fallback: this scan takes the canonical encoding only, and a record it does not take (status
 * 1) goes to protobuf, which reads it or names what is wrong with it. tests/test_tfrecord_scan.py checks that the
 * two agree on written, real and mutated records.
 *
 * The scan itself (protobuf's wire format, the messages, what a record must be to be taken) is
 * ingest/_native/example_scan.h, which the native engine shares.
 *
 * CRCs: given `crc` (the address of the crc32c package's own CRC32C function, found and checked against
 * crc32c.crc32c by ingest/formats/tfrecord.py), the masked CRCs of every record's length and data are checked
 * here, and a record whose CRCs disagree is status 1 (protobuf's path then names the bad CRC). The batch is then
 * checksummed on up to CRC_THREADS native threads and scanned with the GIL released once (a batch's
 * checksums are long enough to be worth spreading and releasing for; docs/measurements.md, Formats); without
 * CRCs the scan is short and keeps the GIL (see ingest/formats/_jpeg.c for why short native calls keep it).
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

#include "example_scan.h"

#define HEAD 5       /* columns before the keys' */
#define MAX_KEYS EX_MAX_KEYS
#define FRAMING EX_FRAMING   /* uint64 length, uint32 CRC, data, uint32 CRC */
#define CRC_THREADS 4
#define CRC_PER_THREAD 16   /* records per checksumming thread at least: fewer are not worth a thread */

enum { OK = EX_OK, BAIL = EX_BAIL };

typedef uint32_t (*crc_fn)(uint32_t crc, const unsigned char *data, size_t n);

/* TFRecord's masked CRC32C of [p, p + n). */
static uint32_t masked_crc(crc_fn crc, const unsigned char *p, size_t n) {
    return ex_mask(crc(0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu);
}

/* 1 if the record's framing is whole and both its masked CRCs match; 0 otherwise (the scan then bails). */
static int crc_ok(crc_fn crc, const unsigned char *rec, Py_ssize_t n) {
    if (n < FRAMING || ex_le64(rec) != (uint64_t)(n - FRAMING))
        return 0;
    return masked_crc(crc, rec, 8) == ex_le32(rec + 8) &&
           masked_crc(crc, rec + 12, n - FRAMING) == ex_le32(rec + n - 4);
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
static int scan_record(const unsigned char *rec, Py_ssize_t n, const ex_request *rq, int64_t *row, ex_side *sb,
                       int good) {
    memset(row, 0, sizeof(int64_t) * (HEAD + 2 * rq->m));
    row[0] = BAIL;
    if (n < FRAMING)
        return BAIL;
    uint64_t length = ex_le64(rec);
    if (length != (uint64_t)(n - FRAMING))
        return BAIL;
    row[1] = (int64_t)length;
    row[2] = (int64_t)ex_le32(rec + 8);
    row[3] = (int64_t)ex_le32(rec + n - 4);
    if (!good)
        return BAIL;

    ex_span data = {rec + 12, rec + n - 4};
    if (ex_scan_example(data, rq, rec, row + HEAD, sb) != EX_OK)
        return BAIL;
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
    ex_request rq;
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
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(kseq, k), &p, &len) < 0)
            goto done;
        rq.lens[k] = len;
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
    ex_side sb = {side.buf, side.len / (Py_ssize_t)sizeof(int64_t), 0};
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
