/* ingest._plan: the native planner (plan.h) bound for `ingest.native_plan`, which allocates the arrays and reads
 * the results; the native engine calls plan.c directly. Every array is a buffer of the caller's (C-contiguous,
 * the dtype and size given), checked here; a description is parsed on each call. Calls keep the GIL, as
 * ops/_boxes.c's do: they are short, and the Python engine's read stage makes one per batch of a detection chain
 * (`native_plan.Planner`), where a GIL hand-off would cost more than the call (docs/design.md, The GIL).
 *
 * plan(desc, seed, n, indices, epoch, sizes, samples, params[, boxes, counts, min_size, out, kept, kept_counts,
 *      keys]) -> (interpolation, antialias)
 *   desc     float64 description (plan.h, ing_chain_parse)      seed   an int in [0, 2**64)
 *   indices  int64 [n] dataset indices                           epoch  an int >= 0
 *   sizes    int64 [n, 2] probed (height, width)
 *   samples  writable [n] ing_sample records (SAMPLE_BYTES each)
 *   params   writable int64 [n, nops, PARAMS], or None
 *   boxes    float64 [m, 4] x0 y0 x1 y1, or None (no boxes: the rest are not read)
 *   counts   int64 [n], summing to m                             min_size  a float >= 0
 *   out      writable float64 [m, 4]   kept  writable int64 [m]   kept_counts  writable int64 [n] (ing_boxes)
 *   keys     uint64 [n] sample keys to draw from (then indices may be None), or None
 *
 * pack(desc, seed, samples, interpolation, antialias, origins, decoded, src, strides, ip, fp) -> (gx, gy, gz)
 *   samples  [n] ing_sample records from plan; interpolation, antialias: plan's result
 *   origins  int64 [n, 2] (x0, y0), or None      decoded  int64 [n, 2] (height, width)
 *   src      uint64 [n] pointers                 strides  int64 [n, 3] bytes, or None
 *   ip       writable int64 [n, 16]              fp       writable float64 [n + 1, 16]
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "plan.h"

/* A buffer argument, or none for None when `optional`. */
typedef struct {
    Py_buffer view;
    int held;
} arg;

static int get(PyObject *obj, arg *a, int writable, int optional, const char *name, Py_ssize_t bytes) {
    a->held = 0;
    if (obj == Py_None && optional)
        return 0;
    if (PyObject_GetBuffer(obj, &a->view, (writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    a->held = 1;
    if (a->view.len != bytes) {
        PyErr_Format(PyExc_ValueError, "`%s` has %zd bytes, expected %zd", name, a->view.len, bytes);
        return -1;
    }
    return 0;
}

static void release(arg *args, int count) {
    for (int k = 0; k < count; ++k)
        if (args[k].held)
            PyBuffer_Release(&args[k].view);
}

static void *at(const arg *a) { return a->held ? a->view.buf : NULL; }

static int fail(int code) {
    PyErr_Format(code == ING_EINVAL ? PyExc_ValueError : PyExc_RuntimeError, "native planner: %s (%d)",
                 ing_strerror(code), code);
    return -1;
}

/* The chain of `desc`; -1 with an exception set on failure. */
static int chain_of(PyObject *desc, unsigned long long seed, ing_chain *chain) {
    Py_buffer view;
    if (PyObject_GetBuffer(desc, &view, PyBUF_SIMPLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    int err = view.len % sizeof(double) ? ING_EINVAL
                                        : ing_chain_parse(chain, view.buf, view.len / (Py_ssize_t)sizeof(double), seed);
    PyBuffer_Release(&view);
    return err ? fail(err) : 0;
}

static PyObject *py_plan(PyObject *self, PyObject *args) {
    PyObject *desc, *indices, *sizes, *samples, *params, *boxes = Py_None, *counts = Py_None, *boxes_out = Py_None,
             *kept = Py_None, *kept_counts = Py_None, *keys = Py_None;
    unsigned long long seed;
    long long epoch;
    double min_size = 0.0;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OKnOLOOO|OOdOOOO:plan", &desc, &seed, &n, &indices, &epoch, &sizes, &samples,
                          &params, &boxes, &counts, &min_size, &boxes_out, &kept, &kept_counts, &keys))
        return NULL;
    ing_chain chain;
    if (chain_of(desc, seed, &chain) < 0)
        return NULL;
    arg a[10] = {{.held = 0}};
    PyObject *result = NULL;
    if (n < 0 || get(keys, &a[9], 0, 1, "keys", n * 8) < 0 ||
        get(indices, &a[0], 0, keys != Py_None, "indices", n * 8) < 0 || get(sizes, &a[1], 0, 0, "sizes", n * 16) < 0 ||
        get(samples, &a[2], 1, 0, "samples", n * (Py_ssize_t)sizeof(ing_sample)) < 0 ||
        get(params, &a[3], 1, 1, "params", n * chain.nops * ING_PARAMS * 8) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "plan: n < 0");
        goto done;
    }
    ing_boxes given = {.min_size = min_size};
    if (boxes != Py_None) {
        Py_ssize_t m;
        if (PyObject_GetBuffer(boxes, &a[4].view, PyBUF_SIMPLE | PyBUF_C_CONTIGUOUS) < 0)
            goto done;
        a[4].held = 1;
        m = a[4].view.len / 32;
        if (a[4].view.len % 32) {
            PyErr_Format(PyExc_ValueError, "`boxes` has %zd bytes, not a multiple of 32", a[4].view.len);
            goto done;
        }
        if (get(counts, &a[5], 0, 0, "counts", n * 8) < 0 || get(boxes_out, &a[6], 1, 0, "out", m * 32) < 0 ||
            get(kept, &a[7], 1, 0, "kept", m * 8) < 0 || get(kept_counts, &a[8], 1, 0, "kept_counts", n * 8) < 0)
            goto done;
        const int64_t *c = at(&a[5]);
        Py_ssize_t total = 0;
        for (Py_ssize_t k = 0; k < n; ++k)
            total += c[k] > 0 ? c[k] : 0;
        if (total != m) {
            PyErr_Format(PyExc_ValueError, "`counts` sum to %zd, `boxes` has %zd", total, m);
            goto done;
        }
        given.in = at(&a[4]), given.counts = c, given.out = at(&a[6]), given.kept = at(&a[7]);
        given.kept_counts = at(&a[8]);
    }
    ing_plan_out out = {.sample = at(&a[2]), .params = at(&a[3]), .boxes = boxes != Py_None ? &given : NULL,
                        .keys = at(&a[9])};
    int err = ing_plan(&chain, n, at(&a[0]), epoch, at(&a[1]), &out);
    if (err)
        fail(err);
    else
        result = Py_BuildValue("(ii)", out.interpolation, out.antialias);
done:
    release(a, 10);
    return result;
}

static PyObject *py_pack(PyObject *self, PyObject *args) {
    PyObject *desc, *samples, *origins, *decoded, *src, *strides, *ip, *fp;
    unsigned long long seed;
    int interpolation, antialias;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OKnOiiOOOOOO:pack", &desc, &seed, &n, &samples, &interpolation, &antialias, &origins,
                          &decoded, &src, &strides, &ip, &fp))
        return NULL;
    ing_chain chain;
    if (chain_of(desc, seed, &chain) < 0)
        return NULL;
    arg a[7] = {{.held = 0}};
    PyObject *result = NULL;
    if (n < 0 || get(samples, &a[0], 0, 0, "samples", n * (Py_ssize_t)sizeof(ing_sample)) < 0 ||
        get(origins, &a[1], 0, 1, "origins", n * 16) < 0 || get(decoded, &a[2], 0, 0, "decoded", n * 16) < 0 ||
        get(src, &a[3], 0, 0, "src", n * 8) < 0 || get(strides, &a[4], 0, 1, "strides", n * 24) < 0 ||
        get(ip, &a[5], 1, 0, "ip", n * 128) < 0 || get(fp, &a[6], 1, 0, "fp", (n + 1) * 128) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "pack: n < 0");
        goto done;
    }
    ing_plan_out plan = {.sample = at(&a[0]), .interpolation = interpolation, .antialias = antialias};
    int32_t grid[3];
    int err = ing_pack(&chain, n, &plan, at(&a[1]), at(&a[2]), at(&a[3]), at(&a[4]), at(&a[5]), at(&a[6]), grid);
    if (err)
        fail(err);
    else
        result = Py_BuildValue("(iii)", grid[0], grid[1], grid[2]);
done:
    release(a, 7);
    return result;
}

static PyMethodDef methods[] = {
    {"plan", py_plan, METH_VARARGS, "A batch's draws and composed warp (see the top of ingest/_native/plan_py.c)."},
    {"pack", py_pack, METH_VARARGS, "A batch's warp kernel arguments (see the top of ingest/_native/plan_py.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_plan", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__plan(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    /* plan.h's numbers, for ingest.native_plan to check its own copies against */
    struct {
        const char *name;
        long value;
    } constants[] = {
        {"SAMPLE_BYTES", (long)sizeof(ing_sample)}, {"RECORD", ING_RECORD}, {"MAX_OPS", ING_MAX_OPS},
        {"DESC_VERSION", ING_DESC_VERSION}, {"RESIZE", ING_RESIZE}, {"CENTER_CROP", ING_CENTER_CROP},
        {"RANDOM_RESIZED_CROP", ING_RANDOM_RESIZED_CROP}, {"FLIP", ING_FLIP}, {"ZOOM_OUT", ING_ZOOM_OUT},
        {"IOU_CROP", ING_IOU_CROP}, {"PAD_TO", ING_PAD_TO}, {"PARAMS", ING_PARAMS}, {"MAX_IOUS", ING_MAX_IOUS},
        {"RESIZE_SIZE", ING_RESIZE_SIZE},
        {"RESIZE_SHORTER", ING_RESIZE_SHORTER}, {"RESIZE_LONGER", ING_RESIZE_LONGER}, {"NEAREST", ING_NEAREST},
        {"BILINEAR", ING_BILINEAR}, {"BICUBIC", ING_BICUBIC},
    };
    for (size_t k = 0; k < sizeof constants / sizeof constants[0]; ++k)
        if (PyModule_AddIntConstant(m, constants[k].name, constants[k].value) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
