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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define GOLDEN 0x9E3779B97F4A7C15ULL

static inline uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static inline uint64_t combine(uint64_t h, uint64_t v) { return mix(h ^ mix(v + GOLDEN)); }

static inline double unit(uint64_t x) { return (double)(x >> 11) * 0x1.0p-53; }

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

static PyMethodDef methods[] = {
    {"uniform", py_uniform, METH_VARARGS, "A batch's uniform numbers (see the top of ingest/_random.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_random", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__random(void) { return PyModule_Create(&module); }
