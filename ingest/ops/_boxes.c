/* A detection batch's box work in one call each, holding the GIL (short calls: see docs/design.md, "The GIL").
 *
 * iou_crops(keys, call, sizes, boxes, starts, choices, scale_lo, scale_hi, aspect_lo, aspect_hi, attempts,
 *           rounds, out) -> None
 *   `ingest.ops.detection.RandomIoUCrop.draw` for a batch: per sample, its rounds and their attempts in order,
 *   stopping at the first crop that qualifies, with the numbers the numpy form (the fallback and the
 *   reference) draws from `ingest.random.SampleRandom`: the op's child source is spawned at call ``call`` of
 *   the sample's key, round r draws from that child's r-th spawn (call 0: the threshold, call 1: 4 numbers per
 *   attempt). The arithmetic is that method's, operation for operation in float64 (built without fused
 *   multiply-adds), so the two give the same crops.
 *   keys     uint64 buffer [N]
 *   sizes    int64 buffer [N, 2] (height, width)
 *   boxes    float64 buffer [M, 4] (x0, y0, x1, y1); sample n's are rows starts[n]..starts[n + 1] - 1
 *   starts   int64 buffer [N + 1], non-decreasing from 0 to M
 *   choices  float64 buffer [L] of thresholds, NaN for "no crop"
 *   out      writable int64 buffer [N, 5]: top, left, height, width, cropped (0: the whole image)
 *
 * map_boxes(boxes, owner, inverse, sizes, out, nonempty) -> None
 *   `ingest.ops.affine.map_boxes` and `nonempty`: each box's four corners through its sample's inverse map
 *   (output = inverse @ input), their bounding box, clipped to the output image; ``nonempty`` set where the
 *   result has width and height above zero. Same operations, in the same order, as the numpy form.
 *   boxes    float64 buffer [M, 4]
 *   owner    int64 buffer [M]: each box's sample, in [0, N)
 *   inverse  float64 buffer [N, 3, 3]
 *   sizes    int64 buffer [N, 2] (height, width) of each sample's output
 *   out      writable float64 buffer [M, 4] (may be ``boxes`` itself)
 *   nonempty writable bool buffer [M]
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#include "../_native/boxes_core.h"   /* the draw and the map, shared with the native planner */

static PyObject *py_iou_crops(PyObject *self, PyObject *args) {
    Py_buffer keys, sizes, boxes, starts, choices, out;
    unsigned long long call;
    ing_iou_config c;
    long attempts, rounds;
    if (!PyArg_ParseTuple(args, "y*Ky*y*y*y*ddddllw*:iou_crops", &keys, &call, &sizes, &boxes, &starts, &choices,
                          &c.s0, &c.s1, &c.a0, &c.a1, &attempts, &rounds, &out))
        return NULL;
    c.attempts = attempts, c.rounds = rounds;
    PyObject *result = NULL;
    Py_ssize_t n = keys.len / 8, m = boxes.len / 32;
    const int64_t *st = starts.buf, *hw = sizes.buf;
    if (keys.len % 8 || sizes.len != n * 16 || boxes.len % 32 || starts.len != (n + 1) * 8 || out.len != n * 40 ||
        choices.len < 8 || choices.len % 8) {
        PyErr_Format(PyExc_ValueError, "iou_crops: %zd key, %zd size, %zd box, %zd start, %zd choice and %zd output "
                     "bytes", keys.len, sizes.len, boxes.len, starts.len, choices.len, out.len);
        goto done;
    }
    if (st[0] != 0 || st[n] != m) {
        PyErr_SetString(PyExc_ValueError, "iou_crops: starts must run from 0 to the number of boxes");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; ++i)
        if (st[i + 1] < st[i]) {
            PyErr_SetString(PyExc_ValueError, "iou_crops: starts must not decrease");
            goto done;
        }
    c.choices = choices.buf;
    c.n_choices = choices.len / 8;
    const uint64_t *key = keys.buf;
    const double *b = boxes.buf;
    int64_t *o = out.buf;
    for (Py_ssize_t i = 0; i < n; ++i)
        ing_iou_crop(key[i], (uint64_t)call, hw[2 * i], hw[2 * i + 1], b + 4 * st[i], st[i + 1] - st[i], &c,
                     o + 5 * i);
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&keys);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&boxes);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&choices);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *py_map_boxes(PyObject *self, PyObject *args) {
    Py_buffer boxes, owner, inverse, sizes, out, keep;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*:map_boxes", &boxes, &owner, &inverse, &sizes, &out, &keep))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t m = boxes.len / 32, n = inverse.len / 72;
    if (boxes.len % 32 || owner.len != m * 8 || inverse.len % 72 || sizes.len != n * 16 || out.len != boxes.len ||
        keep.len != m) {
        PyErr_Format(PyExc_ValueError, "map_boxes: %zd box, %zd owner, %zd matrix, %zd size, %zd output and %zd flag "
                     "bytes", boxes.len, owner.len, inverse.len, sizes.len, out.len, keep.len);
        goto done;
    }
    const int64_t *own = owner.buf, *hw = sizes.buf;
    for (Py_ssize_t i = 0; i < m; ++i)
        if (own[i] < 0 || own[i] >= n) {
            PyErr_Format(PyExc_ValueError, "map_boxes: box %zd belongs to sample %lld of %zd", i, (long long)own[i], n);
            goto done;
        }
    const double *in = boxes.buf, *inv = inverse.buf;
    double *o = out.buf;
    char *k = keep.buf;
    for (Py_ssize_t i = 0; i < m; ++i)
        k[i] = (char)ing_map_box(in + 4 * i, inv + 9 * own[i], hw + 2 * own[i], o + 4 * i);
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&boxes);
    PyBuffer_Release(&owner);
    PyBuffer_Release(&inverse);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&out);
    PyBuffer_Release(&keep);
    return result;
}

static PyMethodDef methods[] = {
    {"iou_crops", py_iou_crops, METH_VARARGS, "A batch's RandomIoUCrop draws (see the top of ingest/ops/_boxes.c)."},
    {"map_boxes", py_map_boxes, METH_VARARGS, "A batch's boxes through one op (see the top of ingest/ops/_boxes.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_boxes", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__boxes(void) { return PyModule_Create(&module); }
