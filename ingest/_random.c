/* The per-sample random numbers of `ingest.random.SampleRandom.random` for a whole batch in one call, holding
 * the GIL: numpy's version is ~15 array operations, each of which lets the GIL go on arrays of more than 500
 * elements (a [256, 10] draw is 2,560), and beside a busy Python thread each such release costs up to a
 * switch interval (5 ms) to get the GIL back. The arithmetic is the module's exactly (uint64, wrapping):
 *
 *   mix(x)        splitmix64's finalizer
 *   combine(h, v) mix(h ^ mix(v + GOLDEN))
 *   h[n]          combine(keys[n], call)
 *   bits[n, j]    combine(h[n], j)            (k columns), or mix(h[n]) (k < 0: one number per sample)
 *   out           (bits >> 11) * 2**-53       (a double in [0, 1), exact)
 *
 * uniform(keys, call, k, out) -> None
 *   keys  uint64 buffer of B sample keys
 *   call  the draw's call number (an int in [0, 2**64))
 *   k     numbers per sample (k < 0: one, as ``random()`` without k)
 *   out   writable float64 buffer of B * max(k, 1) items, row-major [B, k]
 *
 * resized_crops(keys, call, sizes, scale_lo, scale_hi, ratio_lo, ratio_hi, out) -> None
 *   `ingest.ops.geometry.RandomResizedCrop.draw` for a batch: the numbers of calls ``call`` (20 per sample:
 *   10 areas, 10 log-aspects) and ``call + 1`` (2: the position), then torchvision's procedure per sample,
 *   in the operations and order of that method's numpy form (which stays the fallback), so the two agree
 *   wherever libm's exp and numpy's agree (to the last bit on the machines tested; a differing last bit
 *   could move a size only at an exact .5). It replaces ~100 small numpy calls per 256 samples.
 *   sizes  int64 buffer [B, 2] (height, width), each >= 1
 *   out    writable int64 buffer [B, 4]: top, left, height, width
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#include "_splitmix.h"

static PyObject *py_uniform(PyObject *self, PyObject *args) {
    Py_buffer keys, out;
    unsigned long long call;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "y*Knw*:uniform", &keys, &call, &k, &out))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t b = keys.len / 8, cols = k < 0 ? 1 : k;
    if (keys.len % 8 || out.len != b * cols * 8) {
        PyErr_Format(PyExc_ValueError, "uniform: %zd key bytes and %zd output bytes for %zd per sample",
                     keys.len, out.len, cols);
        goto done;
    }
    const uint64_t *key = keys.buf;
    double *o = out.buf;
    for (Py_ssize_t n = 0; n < b; ++n) {
        uint64_t h = combine(key[n], (uint64_t)call);
        if (k < 0)
            o[n] = unit(mix(h));
        else
            for (Py_ssize_t j = 0; j < k; ++j)
                o[n * k + j] = unit(combine(h, (uint64_t)j));
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&keys);
    PyBuffer_Release(&out);
    return result;
}

/* One sample of resized_crops; u: 20 numbers of the first call, at: 2 of the second. */
static void resized_crop(int64_t h, int64_t w, const double *u, const double *at, const double scale[2],
                         const double ratio[2], int64_t *out) {
    double lo = log(ratio[0]), hi = log(ratio[1]);
    int64_t ch = 0, cw = 0;
    int found = 0;
    for (int j = 0; j < 10 && !found; ++j) {
        double area = (double)(h * w) * (scale[0] + (scale[1] - scale[0]) * u[j]);
        double aspect = exp(lo + (hi - lo) * u[10 + j]);
        int64_t tw = (int64_t)rint(sqrt(area * aspect)), th = (int64_t)rint(sqrt(area / aspect));
        if (tw > 0 && tw <= w && th > 0 && th <= h)
            cw = tw, ch = th, found = 1;
    }
    if (found) {
        out[0] = (int64_t)(at[0] * (double)(h - ch + 1));
        out[1] = (int64_t)(at[1] * (double)(w - cw + 1));
    } else {   /* the whole image, narrowed to the nearest allowed aspect */
        double in_ratio = (double)w / (double)h;
        cw = in_ratio > ratio[1] ? (int64_t)rint((double)h * ratio[1]) : w;
        ch = in_ratio < ratio[0] ? (int64_t)rint((double)w / ratio[0]) : h;
        out[0] = (h - ch) / 2;
        out[1] = (w - cw) / 2;
    }
    out[2] = ch;
    out[3] = cw;
}

static PyObject *py_resized_crops(PyObject *self, PyObject *args) {
    Py_buffer keys, sizes, out;
    unsigned long long call;
    double scale[2], ratio[2];
    if (!PyArg_ParseTuple(args, "y*Ky*ddddw*:resized_crops", &keys, &call, &sizes, &scale[0], &scale[1], &ratio[0],
                          &ratio[1], &out))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t b = keys.len / 8;
    if (keys.len % 8 || sizes.len != b * 16 || out.len != b * 32) {
        PyErr_Format(PyExc_ValueError, "resized_crops: %zd key bytes, %zd size bytes and %zd output bytes",
                     keys.len, sizes.len, out.len);
        goto done;
    }
    const uint64_t *key = keys.buf;
    const int64_t *hw = sizes.buf;
    for (Py_ssize_t n = 0; n < b; ++n)
        if (hw[2 * n] < 1 || hw[2 * n + 1] < 1) {
            PyErr_Format(PyExc_ValueError, "resized_crops: sample %zd is %lld x %lld", n, (long long)hw[2 * n],
                         (long long)hw[2 * n + 1]);
            goto done;
        }
    for (Py_ssize_t n = 0; n < b; ++n) {
        double u[20], at[2];
        uint64_t first = combine(key[n], (uint64_t)call), second = combine(key[n], (uint64_t)call + 1);
        for (int j = 0; j < 20; ++j)
            u[j] = unit(combine(first, (uint64_t)j));
        for (int j = 0; j < 2; ++j)
            at[j] = unit(combine(second, (uint64_t)j));
        resized_crop(hw[2 * n], hw[2 * n + 1], u, at, scale, ratio, (int64_t *)out.buf + 4 * n);
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&keys);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"uniform", py_uniform, METH_VARARGS, "A batch's uniform numbers (see the top of ingest/_random.c)."},
    {"resized_crops", py_resized_crops, METH_VARARGS,
     "A batch's RandomResizedCrop regions (see the top of ingest/_random.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_random", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__random(void) { return PyModule_Create(&module); }
