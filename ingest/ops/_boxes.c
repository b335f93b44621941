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

#include "../_native/random_core.h"   /* the hash behind ingest.random.SampleRandom */

#define SPAWN 0x535041574E000001ULL   /* ingest.random._SPAWN */

typedef struct {
    const double *choices;
    Py_ssize_t n_choices;
    double s0, s1, a0, a1;
    long attempts, rounds;
} IouConfig;

/* Whether the crop (top, left, ch, cw) qualifies for ``threshold`` against boxes b[0..k-1]: some box has its
 * centre strictly inside and the best IoU among those is >= threshold (a NaN IoU makes the best NaN, as
 * numpy's max does, and then none qualifies). */
static int qualifies(const double *b, Py_ssize_t k, int64_t top, int64_t left, int64_t ch, int64_t cw,
                     double threshold) {
    double x0 = (double)left, y0 = (double)top;
    double x1 = x0 + (double)cw, y1 = y0 + (double)ch;
    double area = (double)(cw * ch), best = -1.0;
    int inside = 0, nan = 0;
    for (Py_ssize_t j = 0; j < k; ++j, b += 4) {
        double bx0 = b[0], by0 = b[1], bx1 = b[2], by1 = b[3];
        double cx = (bx0 + bx1) / 2, cy = (by0 + by1) / 2;
        if (!(x0 < cx && cx < x1 && y0 < cy && cy < y1))
            continue;
        inside = 1;
        double iw = (bx1 < x1 ? bx1 : x1) - (bx0 > x0 ? bx0 : x0);
        double ih = (by1 < y1 ? by1 : y1) - (by0 > y0 ? by0 : y0);
        double inter = (iw < 0 ? 0.0 : iw) * (ih < 0 ? 0.0 : ih);
        double uni = (bx1 - bx0) * (by1 - by0) + area - inter;
        double iou = uni > 0 ? inter / uni : 0.0;
        if (iou != iou)
            nan = 1;
        else if (iou > best)
            best = iou;
    }
    return inside && !nan && best >= threshold;
}

/* One sample of iou_crops: out (top, left, height, width, cropped), already the whole image. */
static void iou_crop(uint64_t key, uint64_t call, int64_t h, int64_t w, const double *b, Py_ssize_t k,
                     const IouConfig *c, int64_t *out) {
    if (k == 0)
        return;
    uint64_t rounds = ing_combine(ing_combine(key, call), SPAWN);
    for (long r = 0; r < c->rounds; ++r) {
        uint64_t rk = ing_combine(ing_combine(rounds, (uint64_t)r), SPAWN);
        int64_t span = (int64_t)c->n_choices, pick = (int64_t)(ing_unit(ing_mix(ing_combine(rk, 0))) * (double)span);
        double threshold = c->choices[pick < span - 1 ? pick : span - 1];
        if (threshold != threshold)   /* None: the image stays whole */
            return;
        uint64_t draws = ing_combine(rk, 1);
        for (long a = 0; a < c->attempts; ++a) {
            double u[4];
            for (int j = 0; j < 4; ++j)
                u[j] = ing_unit(ing_combine(draws, (uint64_t)(4 * a + j)));
            int64_t cw = (int64_t)((double)w * (c->s0 + (c->s1 - c->s0) * u[0]));
            int64_t ch = (int64_t)((double)h * (c->s0 + (c->s1 - c->s0) * u[1]));
            int64_t left = (int64_t)((double)(w - cw) * u[2]);
            int64_t top = (int64_t)((double)(h - ch) * u[3]);
            if (!(cw > 0 && ch > 0 && c->a0 * (double)ch <= (double)cw && (double)cw <= c->a1 * (double)ch))
                continue;
            if (qualifies(b, k, top, left, ch, cw, threshold)) {
                out[0] = top, out[1] = left, out[2] = ch, out[3] = cw, out[4] = 1;
                return;
            }
        }
    }
}

static PyObject *py_iou_crops(PyObject *self, PyObject *args) {
    Py_buffer keys, sizes, boxes, starts, choices, out;
    unsigned long long call;
    IouConfig c;
    if (!PyArg_ParseTuple(args, "y*Ky*y*y*y*ddddllw*:iou_crops", &keys, &call, &sizes, &boxes, &starts, &choices,
                          &c.s0, &c.s1, &c.a0, &c.a1, &c.attempts, &c.rounds, &out))
        return NULL;
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
    for (Py_ssize_t i = 0; i < n; ++i) {
        int64_t *row = o + 5 * i;
        row[0] = 0, row[1] = 0, row[2] = hw[2 * i], row[3] = hw[2 * i + 1], row[4] = 0;
        iou_crop(key[i], (uint64_t)call, hw[2 * i], hw[2 * i + 1], b + 4 * st[i], st[i + 1] - st[i], &c, row);
    }
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

/* numpy's minimum and maximum: NaN if either is, else the smaller (larger); the first when they compare equal. */
static inline double mn(double a, double b) { return a <= b || a != a ? a : b; }
static inline double mx(double a, double b) { return a >= b || a != a ? a : b; }

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
    for (Py_ssize_t i = 0; i < m; ++i) {
        const double *a = inv + 9 * own[i], *b = in + 4 * i;
        double x0 = b[0], y0 = b[1], x1 = b[2], y1 = b[3], r[4];
        for (int axis = 0; axis < 2; ++axis) {
            double p = a[3 * axis], q = a[3 * axis + 1], s = a[3 * axis + 2];
            double c0 = p * x0 + q * y0 + s, c1 = p * x1 + q * y0 + s, c2 = p * x1 + q * y1 + s,
                   c3 = p * x0 + q * y1 + s;
            double lim = (double)hw[2 * own[i] + 1 - axis];
            double lo = mn(mn(mn(c0, c1), c2), c3), hi = mx(mx(mx(c0, c1), c2), c3);
            /* np.clip(v, 0, lim): min(max(v, 0), lim), NaN kept */
            lo = lo < 0.0 ? 0.0 : lo, lo = lo > lim ? lim : lo;
            hi = hi < 0.0 ? 0.0 : hi, hi = hi > lim ? lim : hi;
            r[axis] = lo, r[axis + 2] = hi;
        }
        o[4 * i] = r[0], o[4 * i + 1] = r[1], o[4 * i + 2] = r[2], o[4 * i + 3] = r[3];
        k[i] = (r[2] - r[0] > 0) && (r[3] - r[1] > 0);
    }
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
