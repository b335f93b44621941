/* Palette and gray PNG masks of a batch decoded on native threads, with at most one GIL hand-off for the batch.
 *
 * ingest/decode/masks.py decodes masks with Pillow, which lets the GIL go and takes it back several times per
 * image; beside a busy Python thread every take-back can wait a switch interval. This module decodes the PNGs
 * a mask usually is on native threads, with the core in ingest/_native/png_decode.h (which also says what it
 * decodes to, what it leaves to Pillow and what it checks). Masks with more pixels than max_pixels are refused
 * from their IHDR before the output is allocated.
 *
 * load() -> None or str: loads zlib (once); a message where it cannot (masks.py then uses Pillow only).
 *
 * decode(buffers, max_pixels, threads) -> list of n results
 *   buffers     sequence of n contiguous byte buffers (bytes, memoryview, uint8 arrays)
 *   max_pixels  masks with more pixels are refused from their IHDR
 *   threads     native threads to decode on (the calling thread is one of them)
 *   result k    None: left to Pillow; (message, offset or None): refused; (bytearray, height, width, itemsize):
 *               the values, row-major, itemsize 1 (uint8) or 2 (uint16)
 *
 * start(buffers, max_pixels, threads) -> pending: decode() begun on `threads` native threads of its own, returning
 *   at once (the headers read and the outputs allocated): the caller does other work meanwhile.
 * finish(pending) -> the list decode() gives. It waits without the GIL only while a thread is still decoding, so
 *   a batch that is done by then costs the caller no GIL hand-off at all. A pending batch dropped unfinished
 *   waits for its threads when it is freed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "png_decode.h"

/* -- a batch on native threads ------------------------------------------------------------------------------ */

#define MAX_THREADS 64

/* A batch from its inputs to its results: the buffers held, the jobs, the outputs, the threads decoding them. */
typedef struct {
    PyObject *seq, *outs; /* the buffers' sequence; n output bytearrays (NULL where not decoded) */
    Py_buffer *views;
    Py_ssize_t n, held;   /* held: views taken */
    ing_png *jobs;
    Py_ssize_t *todo;     /* indices of the jobs to decode */
    Py_ssize_t todo_n, next;
    pthread_t ids[MAX_THREADS];
    long started, finished; /* threads started (start()), and those done (atomic) */
    int joined;
} Pending;

static void *work(void *arg) {
    Pending *b = arg;
    ing_png_worker wk;
    memset(&wk, 0, sizeof wk);
    for (;;) {
        Py_ssize_t k = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (k >= b->todo_n)
            break;
        ing_png *j = &b->jobs[b->todo[k]];
        ing_png_decode(j, &wk);
    }
    ing_png_worker_free(&wk);
    __atomic_add_fetch(&b->finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

static long thread_count(const Pending *b, long threads) {
    long t = threads < b->todo_n ? threads : (long)b->todo_n;
    return t < 1 ? 1 : t > MAX_THREADS ? MAX_THREADS : t;
}

/* Every job on up to `threads` threads, the caller's included; called without the GIL. */
static void run(Pending *b, long threads) {
    pthread_t ids[MAX_THREADS];
    long extra = thread_count(b, threads) - 1, started = 0;
    for (; started < extra; ++started)
        if (pthread_create(&ids[started], NULL, work, b) != 0)
            break; /* fewer threads: the rest still gets done */
    work(b);
    for (long t = 0; t < started; ++t)
        pthread_join(ids[t], NULL);
}

/* Waits for start()'s threads: without the GIL unless all have finished (then joining them takes no time). */
static void join(Pending *b) {
    if (b->joined)
        return;
    if (__atomic_load_n(&b->finished, __ATOMIC_ACQUIRE) < b->started) {
        Py_BEGIN_ALLOW_THREADS
        for (long t = 0; t < b->started; ++t)
            pthread_join(b->ids[t], NULL);
        Py_END_ALLOW_THREADS
    } else {
        for (long t = 0; t < b->started; ++t)
            pthread_join(b->ids[t], NULL);
    }
    b->joined = 1;
}

static void pending_free(Pending *b) {
    join(b);
    for (Py_ssize_t k = 0; k < b->held; k++)
        PyBuffer_Release(&b->views[k]);
    PyMem_Free(b->views);
    PyMem_Free(b->jobs);
    PyMem_Free(b->todo);
    Py_XDECREF(b->outs);
    Py_XDECREF(b->seq);
    PyMem_Free(b);
}

/* The batch's headers read and its outputs allocated (with the GIL); NULL with an exception set. */
static Pending *prepare(PyObject *buffers, long long max_pixels) {
    if (ing_z.lib == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "zlib is not loaded (call load() first)");
        return NULL;
    }
    Pending *b = PyMem_Calloc(1, sizeof(Pending));
    if (b == NULL)
        return (Pending *)PyErr_NoMemory();
    b->joined = 1; /* no threads yet */
    if ((b->seq = PySequence_Fast(buffers, "buffers must be a sequence")) == NULL)
        goto fail;
    Py_ssize_t n = b->n = PySequence_Fast_GET_SIZE(b->seq);
    b->views = PyMem_Calloc(n > 0 ? n : 1, sizeof(Py_buffer));
    b->jobs = PyMem_Calloc(n > 0 ? n : 1, sizeof(ing_png));
    b->todo = PyMem_Calloc(n > 0 ? n : 1, sizeof(Py_ssize_t));
    if (b->views == NULL || b->jobs == NULL || b->todo == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if ((b->outs = PyList_New(n)) == NULL)
        goto fail;
    for (; b->held < n; b->held++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(b->seq, b->held), &b->views[b->held], PyBUF_C_CONTIGUOUS) < 0)
            goto fail;
    for (Py_ssize_t k = 0; k < n; ++k) {
        ing_png *j = &b->jobs[k];
        j->data = b->views[k].buf;
        j->len = (size_t)b->views[k].len;
        j->offset = -1;
        if (ing_png_header(j) != ING_PNG_DECODED)
            continue;
        if ((long long)j->width * j->height > max_pixels) {
            png_refuse(j, -1, "mask of %ux%u pixels exceeds max_pixels=%lld", j->width, j->height, max_pixels);
            continue;
        }
        Py_ssize_t size = (Py_ssize_t)j->width * j->height * (Py_ssize_t)ing_png_itemsize(j);
        PyObject *out = PyByteArray_FromStringAndSize(NULL, size);
        if (out == NULL)
            goto fail;
        PyList_SET_ITEM(b->outs, k, out);
        j->out = (uint8_t *)PyByteArray_AS_STRING(out);
        b->todo[b->todo_n++] = k;
    }
    return b;
fail:
    pending_free(b);
    return NULL;
}

/* The results (see the top of this file); the batch decoded and joined. */
static PyObject *results(Pending *b) {
    PyObject *result = PyList_New(b->n);
    if (result == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < b->n; ++k) {
        ing_png *j = &b->jobs[k];
        PyObject *item;
        if (j->status == ING_PNG_PILLOW) {
            item = Py_None;
            Py_INCREF(item);
        } else if (j->status == ING_PNG_REFUSED) {
            item = j->offset < 0 ? Py_BuildValue("(sO)", j->message, Py_None)
                                 : Py_BuildValue("(sL)", j->message, j->offset);
        } else {
            item = Py_BuildValue("(OIIi)", PyList_GET_ITEM(b->outs, k), j->height, j->width, (int)ing_png_itemsize(j));
        }
        if (item == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SET_ITEM(result, k, item);
    }
    return result;
}

/* -- Python ------------------------------------------------------------------------------------------------- */

static PyObject *py_load(PyObject *self, PyObject *noargs) {
    const char *message = ing_png_load();
    if (message != NULL)
        return PyUnicode_FromString(message);
    Py_RETURN_NONE;
}

/* decode's and start's arguments (buffers, max_pixels, threads), prepared; NULL with an exception set. */
static Pending *prepare_args(PyObject *args, const char *format, long *threads) {
    PyObject *buffers;
    long long max_pixels;
    if (!PyArg_ParseTuple(args, format, &buffers, &max_pixels, threads))
        return NULL;
    return prepare(buffers, max_pixels);
}

static PyObject *py_decode(PyObject *self, PyObject *args) {
    long threads;
    Pending *b = prepare_args(args, "OLl:decode", &threads);
    if (b == NULL)
        return NULL;
    if (b->todo_n > 0) {
        Py_BEGIN_ALLOW_THREADS
        run(b, threads);
        Py_END_ALLOW_THREADS
    }
    PyObject *result = results(b);
    pending_free(b);
    return result;
}

#define CAPSULE "ingest.decode._png.Pending"

static void capsule_free(PyObject *capsule) {
    Pending *b = PyCapsule_GetPointer(capsule, CAPSULE);
    if (b != NULL)
        pending_free(b);
}

static PyObject *py_start(PyObject *self, PyObject *args) {
    long threads;
    Pending *b = prepare_args(args, "OLl:start", &threads);
    if (b == NULL)
        return NULL;
    b->joined = 0;
    if (b->todo_n > 0) {
        long want = thread_count(b, threads);
        while (b->started < want && pthread_create(&b->ids[b->started], NULL, work, b) == 0)
            b->started++;
        if (b->started == 0) { /* no thread could start: decode here */
            Py_BEGIN_ALLOW_THREADS
            run(b, 1);
            Py_END_ALLOW_THREADS
        }
    }
    PyObject *capsule = PyCapsule_New(b, CAPSULE, capsule_free);
    if (capsule == NULL)
        pending_free(b);
    return capsule;
}

static PyObject *py_finish(PyObject *self, PyObject *capsule) {
    Pending *b = PyCapsule_GetPointer(capsule, CAPSULE);
    if (b == NULL)
        return NULL;
    join(b);
    PyObject *result = results(b);
    if (result != NULL) { /* finished with: freed now, not when the capsule goes */
        PyCapsule_SetDestructor(capsule, NULL);
        PyCapsule_SetName(capsule, CAPSULE ".finished");
        pending_free(b);
    }
    return result;
}

static PyMethodDef methods[] = {
    {"load", py_load, METH_NOARGS, "Load zlib; None, or why it cannot (see the top of ingest/decode/_png.c)."},
    {"decode", py_decode, METH_VARARGS, "PNG masks of a batch (see the top of ingest/decode/_png.c)."},
    {"start", py_start, METH_VARARGS, "decode() started on native threads (see the top of ingest/decode/_png.c)."},
    {"finish", py_finish, METH_O, "start()'s results (see the top of ingest/decode/_png.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_png", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__png(void) { return PyModule_Create(&module); }
