/* Batched file reads on native threads: the GIL is released once per batch, not once per file.
 *
 * ingest/io.py plans the reads; this module only runs them. A batch is n tasks; task k reads from byte
 * offsets[k] of a file (fds[k] when >= 0, else paths[k], opened and closed here) into its segments
 * first[k] .. first[k+1]-1, in order, with preadv until every segment is full or the file ends. A segment
 * is (addrs[s], lens[s]); address 0 means "read and drop" (a gap between two wanted ranges of one read).
 *
 * read(paths, fds, offsets, first, addrs, lens, out, threads) -> None
 *   paths    list of n entries: str, bytes or os.PathLike where fds[k] < 0, anything where fds[k] >= 0
 *   fds      int64 buffer of n descriptors (-1: open paths[k] read-only)
 *   offsets  int64 buffer of n file offsets
 *   first    int64 buffer of n + 1 segment indices (first[0] == 0, non-decreasing)
 *   addrs    uint64 buffer of segment addresses (host memory the caller keeps alive; 0: drop)
 *   lens     int64 buffer of segment lengths
 *   out      writable int64 buffer of n: bytes read, or -errno where opening or reading failed
 *   threads  threads to spread the tasks over (the calling thread is one of them)
 *
 * sizes(paths, out, threads) -> None: out[k] = size in bytes of paths[k] (stat), or -errno.
 *
 * plan_rows(files, offsets, slot, fd_table, row, gap, chunk, max_rows, base, base_len,
 *           fds, task_offsets, first, addrs, lens, want[, dense]) -> (tasks, segments, total bytes, longest task)
 *   The tasks `read` takes for n fixed-size rows of `row` bytes (row k at offsets[k] of file files[k]) landing
 *   in host memory at base + slot[k] * row (slot None: base + k * row), in one call that keeps the GIL
 *   (io.plan_rows + ByteReader._rows_posix do the same with numpy, whose array operations give the GIL up on
 *   more than 500 items: ~20 hand-offs for a batch of 512). Rows sorted by (file, offset, k); a row joins the
 *   previous task when it is in the same file, starts at or after its end and at most `gap` bytes later (the
 *   gap read and dropped), while the task stays in one `chunk`-byte piece of its first span and holds at
 *   most `max_rows` rows of that span. fd_table[f] is file f's open descriptor. Outputs (int64, or uint64 for
 *   addrs): n entries (fds, task_offsets, want: each task's bytes), n + 1 (first), 2n (addrs, lens), and
 *   where given n (dense: 1 for a task whose rows are back to back in the file and land back to back in
 *   memory, in order, so that its bytes can be read as they are to its first address; else 0).
 *
 * addresses(buffers, out) -> None: out[k] = the address of the first byte of buffers[k] (any contiguous buffer),
 *   for a planner that turns views of a file's memory map into byte ranges of the file (ingest/formats/lmdb.py).
 *
 * crc32c(data[, software]) -> int: the CRC32C of a buffer (== crc32c.crc32c(data)); software: the table path even
 *   where the CPU has SSE4.2 (tests compare both). Keeps the GIL (one record: microseconds).
 *
 * crcs(buffers, out) -> None: out[k] = the CRC32C of buffers[k] (any contiguous buffers; out a writable uint32
 *   buffer of n), with the GIL released once for the batch (ingest.formats.checks.crcs).
 *
 * Neither read nor plan_rows checks that the addresses are writable for their lengths: that is io.py's job (every
 * address it passes is a slice of a buffer it holds).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "_native/crc32c.h"
#include "_native/preadv.h"

/* -- a parallel for over task indices --------------------------------------------------------------- */

typedef struct Batch Batch;
typedef void (*task_fn)(Batch *, Py_ssize_t);

struct Batch {
    task_fn run;
    Py_ssize_t n, next; /* next: the first task no thread has taken, advanced atomically */
    char **paths;
    const int64_t *fds, *offsets, *first, *lens;
    const uint64_t *addrs;
    int64_t *out;
    char *scratch; /* gap bytes of every thread land here, unread */
};

static void *worker(void *arg) {
    Batch *b = arg;
    for (;;) {
        Py_ssize_t k = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (k >= b->n)
            return NULL;
        b->run(b, k);
    }
}

/* Runs every task on `threads` threads, the caller's included; called without the GIL. */
static void run_spawned(Batch *b, long threads) {
    pthread_t ids[256];
    long started = 0;
    for (; started < threads - 1; ++started)
        if (pthread_create(&ids[started], NULL, worker, b) != 0)
            break; /* fewer threads: the rest still gets done */
    worker(b);
    for (long t = 0; t < started; ++t)
        pthread_join(ids[t], NULL);
}

/* Helper threads kept for the process's life, so no batch pays for starting and joining its threads (see
 * docs/measurements.md, Reads). One batch runs on them at a time; the caller
 * announces it (a new generation) and works on it too, then closes it to helpers that wake late and waits for
 * those that joined to leave it (`batch` lives on the caller's stack). A batch that finds them busy (another
 * Python thread's reads) starts its own threads. A fork child starts its own helpers (`reset_in_child`). */
static struct {
    pthread_mutex_t lock; /* guards everything below */
    pthread_cond_t wake, left;
    Batch *batch;
    unsigned long generation;
    long wanted, joined, running; /* helpers: asked for, that took part, still inside worker() */
    long started;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .left = PTHREAD_COND_INITIALIZER};
static pthread_mutex_t pool_taken = PTHREAD_MUTEX_INITIALIZER;

static void *helper(void *arg) {
    unsigned long seen = (unsigned long)(uintptr_t)arg; /* the generation before the batch it was started for */
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        while (pool.generation == seen)
            pthread_cond_wait(&pool.wake, &pool.lock);
        seen = pool.generation;
        if (pool.batch == NULL || pool.joined >= pool.wanted)
            continue;
        Batch *b = pool.batch;
        pool.joined++;
        pool.running++;
        pthread_mutex_unlock(&pool.lock);
        worker(b);
        pthread_mutex_lock(&pool.lock);
        if (--pool.running == 0)
            pthread_cond_signal(&pool.left);
    }
    return NULL;
}

static void reset_in_child(void) {
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.left, NULL);
    pthread_mutex_init(&pool_taken, NULL);
    pool.batch = NULL;
    pool.wanted = pool.joined = pool.running = pool.started = 0;
}

/* Runs every task on up to `threads` threads, the caller's included; called without the GIL. */
static void run_all(Batch *b, long threads) {
    long extra = threads - 1;
    if (extra > b->n - 1)
        extra = b->n - 1;
    if (extra > 256)
        extra = 256;
    if (extra <= 0) {
        worker(b);
        return;
    }
    if (pthread_mutex_trylock(&pool_taken) != 0) {
        run_spawned(b, extra + 1);
        return;
    }
    pthread_mutex_lock(&pool.lock);
    if (pool.started < extra) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_t id;
        while (pool.started < extra &&
               pthread_create(&id, &attr, helper, (void *)(uintptr_t)pool.generation) == 0)
            pool.started++;
        pthread_attr_destroy(&attr);
    }
    pool.batch = b;
    pool.wanted = extra < pool.started ? extra : pool.started;
    pool.joined = 0;
    pool.generation++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    worker(b);
    pthread_mutex_lock(&pool.lock);
    pool.wanted = pool.joined; /* closed: a helper that wakes now stays out */
    while (pool.running > 0)
        pthread_cond_wait(&pool.left, &pool.lock);
    pool.batch = NULL;
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool_taken);
}

/* -- the two kinds of task -------------------------------------------------------------------------- */

static void read_task(Batch *b, Py_ssize_t k) {
    int fd = (int)b->fds[k];
    if (fd < 0) {
        fd = open(b->paths[k], O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            b->out[k] = -(int64_t)errno;
            return;
        }
    }
    b->out[k] = ing_preadv_full(fd, b->offsets[k], b->addrs + b->first[k], b->lens + b->first[k],
                                b->first[k + 1] - b->first[k], b->scratch);
    if (b->fds[k] < 0)
        close(fd);
}

static void size_task(Batch *b, Py_ssize_t k) {
    struct stat st;
    b->out[k] = stat(b->paths[k], &st) == 0 ? (int64_t)st.st_size : -(int64_t)errno;
}

/* -- argument plumbing -------------------------------------------------------------------------------- */

typedef struct {
    Py_buffer views[12];
    int held;
    PyObject *encoded; /* list of the bytes objects behind paths[] */
    char **paths;
} Args;

static void release(Args *a) {
    for (int v = 0; v < a->held; ++v)
        PyBuffer_Release(&a->views[v]);
    Py_XDECREF(a->encoded);
    PyMem_Free(a->paths);
}

/* Buffer `obj` as `count` items of 8 bytes (count < 0: any count, returned); writable if asked. */
static Py_ssize_t int64s(Args *a, PyObject *obj, Py_ssize_t count, int writable, const char *name) {
    Py_buffer *view = &a->views[a->held];
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    a->held++;
    if (view->len % 8 || (count >= 0 && view->len != count * 8)) {
        if (count >= 0)
            PyErr_Format(PyExc_ValueError, "%s: expected %zd items of 8 bytes, got %zd bytes", name, count,
                         view->len);
        else
            PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of 8-byte items", name,
                         view->len);
        return -1;
    }
    return view->len / 8;
}

/* paths[k] as a file-system path, for each k with fds == NULL or fds[k] < 0. */
static int encode_paths(Args *a, PyObject *paths, Py_ssize_t n, const int64_t *fds) {
    if (!PyList_Check(paths) || PyList_GET_SIZE(paths) != n) {
        PyErr_Format(PyExc_TypeError, "paths must be a list of %zd entries", n);
        return -1;
    }
    a->paths = PyMem_Calloc(n ? n : 1, sizeof(char *));
    a->encoded = PyList_New(0);
    if (a->paths == NULL || a->encoded == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; ++k) {
        if (fds != NULL && fds[k] >= 0)
            continue;
        PyObject *bytes = NULL;
        if (!PyUnicode_FSConverter(PyList_GET_ITEM(paths, k), &bytes))
            return -1;
        int failed = PyList_Append(a->encoded, bytes);
        Py_DECREF(bytes); /* the list holds it */
        if (failed)
            return -1;
        a->paths[k] = PyBytes_AS_STRING(bytes);
    }
    return 0;
}

static PyObject *py_read(PyObject *self, PyObject *args) {
    PyObject *paths, *fds, *offsets, *first, *addrs, *lens, *out;
    long threads;
    if (!PyArg_ParseTuple(args, "OOOOOOOl:read", &paths, &fds, &offsets, &first, &addrs, &lens, &out, &threads))
        return NULL;
    Args a = {0};
    Batch b = {.run = read_task};
    PyObject *result = NULL;
    Py_ssize_t n, m;
    if ((n = int64s(&a, fds, -1, 0, "fds")) < 0 || int64s(&a, offsets, n, 0, "offsets") < 0 ||
        int64s(&a, first, n + 1, 0, "first") < 0 || (m = int64s(&a, addrs, -1, 0, "addrs")) < 0 ||
        int64s(&a, lens, m, 0, "lens") < 0 || int64s(&a, out, n, 1, "out") < 0)
        goto done;
    b.n = n;
    b.fds = a.views[0].buf;
    b.offsets = a.views[1].buf;
    b.first = a.views[2].buf;
    b.addrs = a.views[3].buf;
    b.lens = a.views[4].buf;
    b.out = a.views[5].buf;
    int64_t gap = 0;
    for (Py_ssize_t s = 0; s < m; ++s) {
        if (b.lens[s] < 0) {
            PyErr_SetString(PyExc_ValueError, "lens: a segment of negative length");
            goto done;
        }
        if (!b.addrs[s] && b.lens[s] > gap)
            gap = b.lens[s];
    }
    for (Py_ssize_t k = 0; k < n; ++k)
        if (b.first[k] < 0 || b.first[k] > b.first[k + 1] || b.first[k + 1] > m) {
            PyErr_Format(PyExc_ValueError, "first: task %zd's segments are out of order or range", k);
            goto done;
        }
    if (encode_paths(&a, paths, n, b.fds) < 0)
        goto done;
    b.paths = a.paths;
    if (gap && (b.scratch = PyMem_RawMalloc((size_t)gap)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    run_all(&b, threads);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(b.scratch);
    result = Py_None;
    Py_INCREF(result);
done:
    release(&a);
    return result;
}

static PyObject *py_sizes(PyObject *self, PyObject *args) {
    PyObject *paths, *out;
    long threads;
    if (!PyArg_ParseTuple(args, "OOl:sizes", &paths, &out, &threads))
        return NULL;
    Args a = {0};
    Batch b = {.run = size_task};
    PyObject *result = NULL;
    Py_ssize_t n;
    if ((n = int64s(&a, out, -1, 1, "out")) < 0 || encode_paths(&a, paths, n, NULL) < 0)
        goto done;
    b.n = n;
    b.out = a.views[0].buf;
    b.paths = a.paths;
    Py_BEGIN_ALLOW_THREADS
    run_all(&b, threads);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    release(&a);
    return result;
}

static PyObject *py_addresses(PyObject *self, PyObject *args) {
    PyObject *buffers;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "Ow*", &buffers, &out))
        return NULL;
    PyObject *seq = PySequence_Fast(buffers, "buffers must be a sequence");
    PyObject *result = NULL;
    if (!seq)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (out.len < n * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "out is too small");
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_buffer b;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, k), &b, PyBUF_ANY_CONTIGUOUS) < 0)
            goto done;
        ((int64_t *)out.buf)[k] = (int64_t)(intptr_t)b.buf;
        PyBuffer_Release(&b);
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(seq);
    PyBuffer_Release(&out);
    return result;
}


/* -- planning a batch of fixed-size rows (see plan_rows at the top) ----------------------------------- */

typedef struct {
    int64_t file, offset, k;
} RowKey;

static int row_order(const void *pa, const void *pb) {
    const RowKey *a = pa, *b = pb;
    if (a->file != b->file)
        return a->file < b->file ? -1 : 1;
    if (a->offset != b->offset)
        return a->offset < b->offset ? -1 : 1;
    return a->k < b->k ? -1 : (a->k > b->k);
}

static PyObject *py_plan_rows(PyObject *self, PyObject *args) {
    PyObject *files, *offsets, *slot, *table, *fds, *toffsets, *first, *addrs, *lens, *want, *dense = Py_None;
    long long row, gap, chunk, max_rows, base, base_len;
    if (!PyArg_ParseTuple(args, "OOOOLLLLLLOOOOOO|O:plan_rows", &files, &offsets, &slot, &table, &row, &gap, &chunk,
                          &max_rows, &base, &base_len, &fds, &toffsets, &first, &addrs, &lens, &want, &dense))
        return NULL;
    Args a = {0};
    PyObject *result = NULL;
    RowKey *keys = NULL;
    Py_ssize_t n, files_known;
    if ((n = int64s(&a, files, -1, 0, "files")) < 0 || int64s(&a, offsets, n, 0, "offsets") < 0)
        goto done;
    const int64_t *file = a.views[0].buf, *offset = a.views[1].buf, *slots = NULL;
    int v = 2;
    if (slot != Py_None) {
        if (int64s(&a, slot, n, 0, "slot") < 0)
            goto done;
        slots = a.views[v++].buf;
    }
    if ((files_known = int64s(&a, table, -1, 0, "fd_table")) < 0)
        goto done;
    const int64_t *fd_of = a.views[v++].buf;
    int o = v;
    if (int64s(&a, fds, n, 1, "fds") < 0 || int64s(&a, toffsets, n, 1, "task_offsets") < 0 ||
        int64s(&a, first, n + 1, 1, "first") < 0 || int64s(&a, addrs, 2 * n, 1, "addrs") < 0 ||
        int64s(&a, lens, 2 * n, 1, "lens") < 0 || int64s(&a, want, n, 1, "want") < 0)
        goto done;
    int64_t *t_fd = a.views[o].buf, *t_off = a.views[o + 1].buf, *t_first = a.views[o + 2].buf,
            *s_len = a.views[o + 4].buf, *t_want = a.views[o + 5].buf, *t_dense = NULL;
    uint64_t *s_addr = a.views[o + 3].buf;
    if (dense != Py_None) {
        if (int64s(&a, dense, n, 1, "dense") < 0)
            goto done;
        t_dense = a.views[o + 6].buf;
    }
    if (row <= 0 || gap < 0 || chunk < 0 || max_rows <= 0 || base_len < 0) {
        PyErr_SetString(PyExc_ValueError, "plan_rows: row and max_rows must be > 0, gap, chunk, base_len >= 0");
        goto done;
    }
    if ((keys = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(RowKey))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; ++k) {
        int64_t dest = slots ? slots[k] : k;
        if (file[k] < 0 || file[k] >= files_known || fd_of[file[k]] < 0 || offset[k] < 0 || dest < 0 ||
            dest > (base_len - row) / row || (base_len < row)) {
            PyErr_Format(PyExc_ValueError, "plan_rows: row %zd (file %lld, offset %lld, slot %lld) is out of range",
                         k, (long long)file[k], (long long)offset[k], (long long)dest);
            goto done;
        }
        keys[k] = (RowKey){file[k], offset[k], k};
    }
    qsort(keys, (size_t)n, sizeof(RowKey), row_order);
    const int64_t span = chunk > row ? chunk : row;
    Py_ssize_t tasks = 0, segs = 0, seg_start = 0;
    int64_t total = 0, longest = 0, piece = 0, prev_piece = 0;
    for (Py_ssize_t i = 0; i < n; ++i) {
        const RowKey *r = &keys[i], *p = i ? &keys[i - 1] : NULL;
        /* a new span (a run of rows that may share reads) unless this row follows the last closely */
        int new_span = !p || r->file != p->file || r->offset < p->offset + row || r->offset - (p->offset + row) > gap;
        if (new_span)
            seg_start = i;
        piece = (r->offset - keys[seg_start].offset) / span;
        int lead = new_span || piece != prev_piece || (i - seg_start) / max_rows != (i - 1 - seg_start) / max_rows;
        prev_piece = piece;
        int64_t dest = slots ? slots[r->k] : r->k;
        if (lead) {
            t_first[tasks] = segs;
            t_fd[tasks] = fd_of[r->file];
            t_off[tasks] = r->offset;
            if (t_dense)
                t_dense[tasks] = 1;
            tasks++;
        } else {
            if (r->offset > p->offset + row) {   /* the gap: read and dropped */
                s_addr[segs] = 0;
                s_len[segs++] = r->offset - p->offset - row;
                total += r->offset - p->offset - row;
            }
            if (t_dense && (r->offset != p->offset + row || dest != (slots ? slots[p->k] : p->k) + 1))
                t_dense[tasks - 1] = 0;
        }
        s_addr[segs] = (uint64_t)base + (uint64_t)(dest * row);
        s_len[segs++] = row;
        total += row;
        t_want[tasks - 1] = r->offset + row - t_off[tasks - 1];
        if (t_want[tasks - 1] > longest)
            longest = t_want[tasks - 1];
    }
    t_first[tasks] = segs;
    result = Py_BuildValue("nnLL", tasks, segs, (long long)total, (long long)longest);
done:
    PyMem_Free(keys);
    release(&a);
    return result;
}

/* -- CRC32C ---------------------------------------------------------------------------------------------- */

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer b;
    int software = 0;
    if (!PyArg_ParseTuple(args, "y*|p:crc32c", &b, &software))
        return NULL;
    uint32_t c = software ? ~ing_crc32c_sw(~0u, b.buf, (size_t)b.len) : ing_crc32c(0, b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *py_crcs(PyObject *self, PyObject *args) {
    PyObject *buffers, *seq;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "Ow*:crcs", &buffers, &out))
        return NULL;
    if ((seq = PySequence_Fast(buffers, "crcs: buffers must be a sequence")) == NULL) {
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), held = 0;
    Py_buffer *views = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_buffer));
    PyObject *result = NULL;
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (out.len != n * (Py_ssize_t)sizeof(uint32_t)) {
        PyErr_Format(PyExc_ValueError, "crcs: out holds %zd bytes, %zd buffers need %zd", out.len, n,
                     n * (Py_ssize_t)sizeof(uint32_t));
        goto done;
    }
    for (; held < n; ++held)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &views[held], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
    uint32_t *crc = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; ++k) {
        uint32_t c = ing_crc32c(0, views[k].buf, (size_t)views[k].len);
        memcpy(crc + k, &c, sizeof c);
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t k = 0; k < held; ++k)
        PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    Py_DECREF(seq);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"crc32c", py_crc32c, METH_VARARGS, "The CRC32C of a buffer (see the top of ingest/_readv.c)."},
    {"crcs", py_crcs, METH_VARARGS, "The CRC32C of each of a batch of buffers, the GIL released once."},
    {"read", py_read, METH_VARARGS, "Run a batch of reads (see the top of ingest/_readv.c)."},
    {"sizes", py_sizes, METH_VARARGS, "Sizes of a batch of files, or -errno (see ingest/_readv.c)."},
    {"addresses", py_addresses, METH_VARARGS, "Where each buffer lies in memory (see ingest/_readv.c)."},
    {"plan_rows", py_plan_rows, METH_VARARGS, "The read tasks of a batch of fixed-size rows (see ingest/_readv.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_readv", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__readv(void) {
    static int registered;
    ing_crc32c_init();
    if (!registered && pthread_atfork(NULL, NULL, reset_in_child) == 0)
        registered = 1;
    return PyModule_Create(&module);
}
