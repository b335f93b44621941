/* JPEG headers of a whole batch in one call: the same reading as ingest/decode/cpu.py's read_jpeg_header (which
 * stays the reference and the fallback where this module was not built), without a Python object per image.
 * tests/test_jpeg_headers.py checks the two agree on real, hostile and random inputs.
 *
 * The GIL is kept: a batch's headers take far less than the switch interval that getting the GIL back can cost
 * beside a busy Python thread (docs/measurements.md, The GIL).
 *
 * headers(buffers, out) -> None
 *   buffers  a sequence of n contiguous byte buffers (bytes, memoryview, uint8 arrays)
 *   out      writable int64 buffer of n * 9: per image, the columns of decode.HEADER_COLUMNS:
 *            kind (0 no JPEG signature, 1 frame header found, 2 JPEG without one), height, width, components,
 *            precision, process (the SOF marker), orientation (1-8), rgb (0/1), eoi (ends with FF D9: 0/1).
 *            For kind 0 and 2 only kind and eoi are set; the rest are 0.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../_native/jpeg_scan.h"

#define COLUMNS ING_JPEG_COLUMNS

static PyObject *py_headers(PyObject *self, PyObject *args) {
    PyObject *buffers, *out_obj;
    if (!PyArg_ParseTuple(args, "OO:headers", &buffers, &out_obj))
        return NULL;
    PyObject *seq = PySequence_Fast(buffers, "buffers must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer out;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    PyObject *result = NULL;
    Py_buffer *views = NULL;
    Py_ssize_t held = 0;
    if (out.len != n * COLUMNS * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_Format(PyExc_ValueError, "out must hold %zd int64 values", n * COLUMNS);
        goto done;
    }
    views = PyMem_Calloc(n > 0 ? n : 1, sizeof(Py_buffer));
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < n; held++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &views[held], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
    int64_t *rows = out.buf;
    for (Py_ssize_t k = 0; k < n; k++)
        ing_jpeg_scan(views[k].buf, views[k].len, rows + k * COLUMNS);
    result = Py_None;
    Py_INCREF(result);
done:
    for (Py_ssize_t k = 0; k < held; k++)
        PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    PyBuffer_Release(&out);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"headers", py_headers, METH_VARARGS, "JPEG headers of a batch (see the top of ingest/formats/_jpeg.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_jpeg", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__jpeg(void) { return PyModule_Create(&module); }
