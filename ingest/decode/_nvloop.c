/* The per-image loop of one batched nvImageCodec decode, with the GIL released once for the whole batch.
 *
 * ingest/decode/_nvimgcodec.py owns the library, its handles and the C structs (ctypes mirrors checked against
 * nvimgcodec.h by tests/test_nvimgcodec_native.py); this module only runs, per batch and without the GIL:
 *
 *   for each image: code stream over its bytes -> parse check (JPEG, JPEG 2000, TIFF) -> region view -> image wrapper
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

#include "../_native/nvloop.h"

#define FN_COUNT ING_NV_COUNT
#define OUT_PARSE ING_NV_OUT_PARSE
#define OUT_NOT_JPEG ING_NV_OUT_NOT_JPEG
#define OUT_DECODE ING_NV_OUT_DECODE

static int read_functions(PyObject *tuple, ing_nv_functions *f) {
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
    ing_nv_functions_from(f, p);
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

static PyObject *decode(PyObject *self, PyObject *args) {
    PyObject *fns_obj, *datas_obj, *regions_obj, *out_obj;
    void *instance, *decoder, *params;
    ing_nv_slots s;
    ing_nv_functions f;
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
    /* One block for the loop's scratch: streams, images, data pointers, picked, lengths, statuses. */
    char *scratch = PyMem_Malloc((size_t)(n ? n : 1) *
                                 (3 * sizeof(void *) + sizeof(Py_ssize_t) + sizeof(size_t) + sizeof(uint32_t)));
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
    const unsigned char **ptrs = (const unsigned char **)(images + n);
    ptrdiff_t *picked = (ptrdiff_t *)(ptrs + n);
    size_t *lens = (size_t *)(picked + n);
    uint32_t *statuses = (uint32_t *)(lens + n);
    for (Py_ssize_t k = 0; k < n; ++k) {
        ptrs[k] = (const unsigned char *)datas[k].buf;
        lens[k] = (size_t)datas[k].len;
    }
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = ing_nv_run(&f, instance, decoder, params, n, ptrs, lens, (const int32_t *)regions.buf, &s,
                    (uint32_t *)out.buf, streams, images, picked, statuses);
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
