/* The per-image loop of one batched nvImageCodec decode, with the GIL released once for the whole batch.
 *
 * ingest/decode/_nvimgcodec.py owns the library, its handles and the C structs (ctypes mirrors checked against
 * nvimgcodec.h by tests/test_nvimgcodec_native.py); this module only runs, per batch and without the GIL:
 *
 *   for each image: code stream over its bytes -> parse check (JPEG only) -> region view -> image wrapper
 *   then: one nvimgcodecDecoderDecode over every image that got that far -> wait -> processing statuses
 *
 * It includes no nvImageCodec header, so it builds on any machine with a C compiler: the functions arrive as
 * addresses and the struct fields it writes as offsets, both taken from the ctypes side.
 *
 * decode(fns, instance, decoder, params, datas, regions, slots, infos, views, probe, out) -> int
 *   fns      tuple of 8 function addresses, in the order of FN_* below
 *   datas    sequence of n objects with the buffer protocol (C-contiguous bytes of each image)
 *   regions  writable buffer of n * 4 int32: x0, y0, x1, y1, or x1 <= x0 for the whole image
 *   slots    (parents, subs, images): addresses of n void* each; handles there are reused
 *   infos    (address, stride): n nvimgcodecImageInfo_t, filled by the caller
 *   views    (address, stride, start offset, end offset): n nvimgcodecCodeStreamView_t, region ndim set
 *   probe    (address, codec name offset): one nvimgcodecCodeStreamInfo_t
 *   out      writable buffer of n uint32: the processing status of each image (1: decoded), or
 *            OUT_PARSE | call status, OUT_NOT_JPEG, OUT_DECODE | call status of the batch decode
 * Returns the status of nvimgcodecDecoderDecode (0 when nothing reached it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { FN_CREATE, FN_INFO, FN_SUB, FN_IMAGE, FN_DECODE, FN_WAIT, FN_STATUS, FN_FUTURE_DESTROY, FN_COUNT };
#define OUT_PARSE 0x10000u
#define OUT_NOT_JPEG 0x20000u
#define OUT_DECODE 0x40000u

typedef int (*create_fn)(void *, void **, const unsigned char *, size_t, const void *);
typedef int (*info_fn)(void *, void *);
typedef int (*sub_fn)(void *, void **, const void *);
typedef int (*image_fn)(void *, void **, const void *);
typedef int (*decode_fn)(void *, void *const *, void *const *, int, const void *, void **);
typedef int (*future_fn)(void *);
typedef int (*status_fn)(void *, uint32_t *, size_t *);

typedef struct {
    create_fn create;
    info_fn info;
    sub_fn sub;
    image_fn image;
    decode_fn decode;
    future_fn wait;
    status_fn status;
    future_fn destroy;
} Functions;

static int read_functions(PyObject *tuple, Functions *f) {
    void *p[FN_COUNT];
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != FN_COUNT) {
        PyErr_Format(PyExc_TypeError, "fns must be a tuple of %d function addresses", FN_COUNT);
        return -1;
    }
    for (int k = 0; k < FN_COUNT; ++k) {
        p[k] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(tuple, k));
        if (p[k] == NULL) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "function address %d is null", k);
            return -1;
        }
    }
    f->create = (create_fn)p[FN_CREATE];
    f->info = (info_fn)p[FN_INFO];
    f->sub = (sub_fn)p[FN_SUB];
    f->image = (image_fn)p[FN_IMAGE];
    f->decode = (decode_fn)p[FN_DECODE];
    f->wait = (future_fn)p[FN_WAIT];
    f->status = (status_fn)p[FN_STATUS];
    f->destroy = (future_fn)p[FN_FUTURE_DESTROY];
    return 0;
}

/* A writable buffer of exactly `count` items of `itemsize` bytes, or -1 with an exception set. */
static int writable(PyObject *obj, Py_buffer *view, Py_ssize_t count, Py_ssize_t itemsize, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->len != count * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, expected %zd", what, view->len, count * itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int to_pointer(PyObject *obj, void *out) {
    *(void **)out = PyLong_AsVoidPtr(obj);
    return PyErr_Occurred() ? 0 : 1;
}

typedef struct {
    void **parents, **subs, **images;
    char *infos, *views, *probe;
    Py_ssize_t info_stride, view_stride, start_off, end_off, codec_off;
} Slots;

/* The loop itself, GIL released: returns the batch decode's status, fills out[]. */
static int run(const Functions *f, void *instance, void *decoder, const void *params, Py_ssize_t n,
               const Py_buffer *datas, const int32_t *regions, const Slots *s, uint32_t *out,
               void **streams, void **images, Py_ssize_t *picked, uint32_t *statuses) {
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < n; ++i) {
        int st = f->create(instance, &s->parents[i], (const unsigned char *)datas[i].buf, (size_t)datas[i].len, NULL);
        if (st == 0) { /* parse now: one stream no parser takes would fail the whole batch's decode call */
            st = f->info(s->parents[i], s->probe);
            if (st == 0 && strcmp(s->probe + s->codec_off, "jpeg") != 0) {
                out[i] = OUT_NOT_JPEG;
                continue;
            }
        }
        void *source = s->parents[i];
        const int32_t *r = regions + 4 * i;
        if (st == 0 && r[2] > r[0]) {
            char *view = s->views + i * s->view_stride;
            int32_t *start = (int32_t *)(view + s->start_off), *end = (int32_t *)(view + s->end_off);
            start[0] = r[1]; start[1] = r[0]; end[0] = r[3]; end[1] = r[2];  /* (y, x) order */
            st = f->sub(s->parents[i], &s->subs[i], view);
            source = s->subs[i];
        }
        if (st == 0) st = f->image(instance, &s->images[i], s->infos + i * s->info_stride);
        if (st != 0) {
            out[i] = OUT_PARSE | (uint32_t)st;
            continue;
        }
        streams[m] = source;
        images[m] = s->images[i];
        picked[m++] = i;
    }
    if (m == 0) return 0;
    void *future = NULL;
    int st = f->decode(decoder, streams, images, (int)m, params, &future);
    for (Py_ssize_t k = 0; k < m; ++k) statuses[k] = 0;
    if (future != NULL) {
        f->wait(future);
        if (st == 0) {
            size_t size = (size_t)m;
            f->status(future, statuses, &size);
        }
        f->destroy(future);
    }
    for (Py_ssize_t k = 0; k < m; ++k) out[picked[k]] = st != 0 ? (OUT_DECODE | (uint32_t)st) : statuses[k];
    return st;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    PyObject *fns_obj, *datas_obj, *regions_obj, *out_obj;
    void *instance, *decoder, *params;
    Slots s;
    Functions f;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO&O&O&OO(O&O&O&)(O&n)(O&nnn)(O&n)O", &fns_obj, to_pointer, &instance,
                          to_pointer, &decoder, to_pointer, &params, &datas_obj, &regions_obj,
                          to_pointer, &s.parents, to_pointer, &s.subs, to_pointer, &s.images,
                          to_pointer, &s.infos, &s.info_stride,
                          to_pointer, &s.views, &s.view_stride, &s.start_off, &s.end_off,
                          to_pointer, &s.probe, &s.codec_off, &out_obj))
        return NULL;
    if (read_functions(fns_obj, &f) < 0) return NULL;
    PyObject *seq = PySequence_Fast(datas_obj, "datas must be a sequence of buffers");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), got = 0;
    PyObject *result = NULL;
    Py_buffer regions, out;
    int have_regions = 0, have_out = 0;
    Py_buffer *datas = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_buffer));
    /* One block for the loop's scratch: streams, images, picked, statuses. */
    char *scratch = PyMem_Malloc((size_t)(n ? n : 1) * (2 * sizeof(void *) + sizeof(Py_ssize_t) + sizeof(uint32_t)));
    if (datas == NULL || scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (writable(regions_obj, &regions, n * 4, sizeof(int32_t), "regions") < 0) goto done;
    have_regions = 1;
    if (writable(out_obj, &out, n, sizeof(uint32_t), "out") < 0) goto done;
    have_out = 1;
    for (; got < n; ++got)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &datas[got], PyBUF_C_CONTIGUOUS) < 0) goto done;
    void **streams = (void **)scratch, **images = streams + n;
    Py_ssize_t *picked = (Py_ssize_t *)(images + n);
    uint32_t *statuses = (uint32_t *)(picked + n);
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = run(&f, instance, decoder, params, n, datas, (const int32_t *)regions.buf, &s, (uint32_t *)out.buf,
             streams, images, picked, statuses);
    Py_END_ALLOW_THREADS
    result = PyLong_FromLong(st);
done:
    for (Py_ssize_t k = 0; k < got; ++k) PyBuffer_Release(&datas[k]);
    if (have_regions) PyBuffer_Release(&regions);
    if (have_out) PyBuffer_Release(&out);
    PyMem_Free(datas);
    PyMem_Free(scratch);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "Decode one batch with nvImageCodec, the GIL released once (see the source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nvloop",
                                    "nvImageCodec's per-image batch loop below Python.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__nvloop(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "OUT_PARSE", OUT_PARSE) < 0 || PyModule_AddIntConstant(m, "OUT_NOT_JPEG", OUT_NOT_JPEG) < 0 ||
        PyModule_AddIntConstant(m, "OUT_DECODE", OUT_DECODE) < 0 || PyModule_AddIntConstant(m, "FN_COUNT", FN_COUNT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
