/* The native planner (plan.h): ingest/ops/planner.py's `plan` for the chains plan.h lists, then
 * _warp_kernel.pack's argument rows, in the same double operations in the same order (built with
 * -ffp-contract=off), so that both give the same numbers. Each step names the Python it mirrors. */
#include "plan.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "boxes_core.h"
#include "random_core.h"

#define BLOCK_X 32   /* _warp_kernel._BLOCK */
#define BLOCK_Y 8

const char *ing_strerror(int code) {
    switch (code) {
    case ING_OK: return "ok";
    case ING_EINVAL: return "a malformed chain description or argument";
    case ING_EUNSUPPORTED: return "a chain the native planner does not run";
    case ING_ESIZE: return "a size below 1 or above 2**31 - 1, or a negative dataset index or epoch";
    default: return "unknown error";
    }
}

/* ---------------------------------------------------------------------------------------------- parsing */

/* An integer held exactly in a double, within [lo, hi]; else -1 (callers' ranges exclude it). */
static int64_t whole(double v, int64_t lo, int64_t hi) {
    if (!(v >= (double)lo && v <= (double)hi) || v != floor(v))
        return -1;
    return (int64_t)v;
}

static int parse_op(const double *r, ing_op *op) {
    memset(op, 0, sizeof *op);
    op->kind = (int32_t)whole(r[0], 0, 1000);
    switch (op->kind) {
    case ING_RESIZE:
        op->mode = (int32_t)whole(r[1], 0, 2);
        op->size[0] = whole(r[2], 1, INT32_MAX);
        op->size[1] = op->mode == ING_RESIZE_SIZE ? whole(r[3], 1, INT32_MAX) : 0;
        op->max_size = whole(r[4], 0, INT32_MAX);
        op->interpolation = (int32_t)whole(r[5], 0, 2);
        op->antialias = (int32_t)whole(r[6], 0, 1);
        if (op->mode < 0 || op->size[0] < 0 || op->size[1] < 0 || op->max_size < 0 || op->interpolation < 0 ||
            op->antialias < 0 || (op->max_size && (op->mode != ING_RESIZE_SHORTER || op->max_size <= op->size[0])))
            return ING_EINVAL;
        return ING_OK;
    case ING_CENTER_CROP:
    case ING_RANDOM_RESIZED_CROP:
        op->size[0] = whole(r[1], 1, INT32_MAX);
        op->size[1] = whole(r[2], 1, INT32_MAX);
        if (op->size[0] < 0 || op->size[1] < 0)
            return ING_EINVAL;
        if (op->kind == ING_CENTER_CROP)
            return ING_OK;
        op->scale[0] = r[3], op->scale[1] = r[4], op->ratio[0] = r[5], op->ratio[1] = r[6];
        op->interpolation = (int32_t)whole(r[7], 0, 2);
        op->antialias = (int32_t)whole(r[8], 0, 1);
        /* geometry._range: 0 < min <= max, finite */
        if (!(0.0 < op->scale[0] && op->scale[0] <= op->scale[1] && isfinite(op->scale[1])) ||
            !(0.0 < op->ratio[0] && op->ratio[0] <= op->ratio[1] && isfinite(op->ratio[1])) ||
            op->interpolation < 0 || op->antialias < 0)
            return ING_EINVAL;
        return ING_OK;
    case ING_FLIP:
        op->p = r[1];
        op->horizontal = (int32_t)whole(r[2], 0, 1);
        op->vertical = (int32_t)whole(r[3], 0, 1);
        if (!(op->p >= 0.0 && op->p <= 1.0) || op->horizontal < 0 || op->vertical < 0 ||
            !(op->horizontal || op->vertical))
            return ING_EINVAL;
        return ING_OK;
    case ING_ZOOM_OUT:   /* ZoomOut.__init__: 1 <= min <= max, finite; p a probability */
        op->ratio[0] = r[1], op->ratio[1] = r[2], op->p = r[3];
        if (!(1.0 <= op->ratio[0] && op->ratio[0] <= op->ratio[1] && isfinite(op->ratio[1])) ||
            !(op->p >= 0.0 && op->p <= 1.0))
            return ING_EINVAL;
        return ING_OK;
    case ING_IOU_CROP:   /* RandomIoUCrop.__init__ */
        op->scale[0] = r[1], op->scale[1] = r[2], op->ratio[0] = r[3], op->ratio[1] = r[4];
        op->attempts = whole(r[5], 1, INT32_MAX);
        op->rounds = whole(r[6], 1, INT32_MAX);
        op->n_ious = (int32_t)whole(r[7], 1, ING_MAX_IOUS);
        if (!(0.0 < op->scale[0] && op->scale[0] <= op->scale[1] && op->scale[1] <= 1.0) ||
            !(0.0 < op->ratio[0] && op->ratio[0] <= op->ratio[1] && isfinite(op->ratio[1])) || op->attempts < 0 ||
            op->rounds < 0 || op->n_ious < 0)
            return ING_EINVAL;
        for (int k = 0; k < op->n_ious; ++k) {
            op->min_ious[k] = r[8 + k];
            if (!isnan(r[8 + k]) && !(r[8 + k] >= 0.0 && r[8 + k] <= 1.0))
                return ING_EINVAL;
        }
        return ING_OK;
    case ING_PAD_TO:   /* PadTo.__init__: a size (both sides), a multiple, the batch's largest, or several */
        op->size[0] = whole(r[1], 0, INT32_MAX);
        op->size[1] = whole(r[2], 0, INT32_MAX);
        op->multiple = whole(r[3], 0, INT32_MAX);
        op->center = (int32_t)whole(r[4], 0, 1);
        op->batch = (int32_t)whole(r[5], 0, 1);
        if (op->size[0] < 0 || op->size[1] < 0 || (op->size[0] == 0) != (op->size[1] == 0) || op->multiple < 0 ||
            op->center < 0 || op->batch < 0 || !(op->size[0] || op->multiple || op->batch))
            return ING_EINVAL;
        return ING_OK;
    default:
        return ING_EUNSUPPORTED;
    }
}

int ing_chain_parse(ing_chain *chain, const double *desc, int64_t len, uint64_t seed) {
    if (!chain || !desc || len < 2 * ING_RECORD)
        return ING_EINVAL;
    if (desc[0] != ING_DESC_VERSION)
        return ING_EUNSUPPORTED;
    memset(chain, 0, sizeof *chain);
    int64_t nops = whole(desc[1], 1, ING_MAX_OPS);
    chain->channels = (int32_t)whole(desc[2], 1, 4);
    chain->normalize = (int32_t)whole(desc[3], 0, 1);
    chain->kind = (int32_t)whole(desc[4], 0, 3);
    chain->nchw = (int32_t)whole(desc[5], 0, 1);
    if (nops < 0 || chain->channels < 0 || chain->normalize < 0 || chain->kind < 0 || chain->nchw < 0 ||
        len != ING_RECORD * (2 + nops))
        return ING_EINVAL;
    chain->nops = (int32_t)nops;
    for (int c = 0; c < 4; ++c) {
        chain->a[c] = desc[6 + c];
        chain->b[c] = desc[10 + c];
        chain->fill[c] = desc[ING_RECORD + c];
    }
    for (int k = 0; k < chain->nops; ++k) {
        int err = parse_op(desc + ING_RECORD * (2 + k), &chain->ops[k]);
        if (err)
            return err;
    }
    chain->seed = seed;
    return ING_OK;
}

/* ---------------------------------------------------------------------------------------------- planning */

/* A size the planner takes: 1 to 2**31 - 1 each way (so that no product of the arithmetic overflows). */
static int fits(const int64_t hw[2]) { return hw[0] >= 1 && hw[1] >= 1 && hw[0] <= INT32_MAX && hw[1] <= INT32_MAX; }

/* One op on one sample (GeometryOp._steps, one row): its map (3x3, output -> input), output size, the input
 * region it reads (crop: x0 y0 x1 y1, or none: the whole input) and whether it resamples. */
typedef struct {
    double m[9];
    int64_t out[2];
    double crop[4];
    int cropped, resamples;
} step;

static void identity(double m[9]) {
    memset(m, 0, 9 * sizeof *m);
    m[0] = m[4] = m[8] = 1.0;
}

/* Resize._output_sizes, one row, in its int64 and float64 operations. */
static void resize_size(const ing_op *op, int64_t h, int64_t w, int64_t out[2]) {
    if (op->mode == ING_RESIZE_SIZE) {
        out[0] = op->size[0], out[1] = op->size[1];
        return;
    }
    int portrait = w <= h;
    int64_t shorter = portrait ? w : h, longer = portrait ? h : w, new_short, new_long;
    if (op->mode == ING_RESIZE_LONGER) {
        new_short = (int64_t)((double)(op->size[0] * shorter) / (double)longer);
        new_long = op->size[0];
    } else {
        new_short = op->size[0];
        new_long = (int64_t)((double)(op->size[0] * longer) / (double)shorter);
        if (op->max_size && new_long > op->max_size) {
            new_short = (int64_t)((double)(op->max_size * new_short) / (double)new_long);
            new_long = op->max_size;
        }
    }
    if (new_short < 1)
        new_short = 1;
    out[0] = portrait ? new_long : new_short;
    out[1] = portrait ? new_short : new_long;
}

/* CenterCrop._offset: torchvision pads (c - n) // 2 before a crop larger than the image, else anchors at
 * round((n - c) / 2), ties to even. */
static int64_t centre_offset(int64_t n, int64_t c) {
    return c > n ? -((c - n) / 2) : (int64_t)rint((double)(n - c) / 2.0);
}

/* A translation by (left, top) (output pixel (x, y) is input pixel (x + left, y + top)) to an output of oh x ow,
 * reading the input region of the output's extent (ZoomOut, RandomIoUCrop, PadTo: detection._translation and
 * their crop). */
static void translation(step *st, double left, double top, int64_t oh, int64_t ow) {
    st->m[2] = left, st->m[5] = top;
    st->out[0] = oh, st->out[1] = ow;
    st->crop[0] = left, st->crop[1] = top, st->crop[2] = left + (double)ow, st->crop[3] = top + (double)oh;
    st->cropped = 1;
}

/* One sample through op `op` (its draws made): `hw` its input size, `largest` the batch's largest input height
 * and width (a batch-wide PadTo's), `key` its key, `call` the op's first call number, `boxes` (nboxes x 4) its
 * boxes as mapped so far (RandomIoUCrop's draw reads them). `params` gets the op's ING_PARAMS parameters. */
static void op_step(const ing_op *op, const int64_t hw[2], const int64_t largest[2], uint64_t key, uint64_t call,
                    const double *boxes, int64_t nboxes, step *st, int64_t params[ING_PARAMS]) {
    double h = (double)hw[0], w = (double)hw[1];
    identity(st->m);
    st->cropped = st->resamples = 0;
    memset(params, 0, ING_PARAMS * sizeof *params);
    switch (op->kind) {
    case ING_RESIZE:
        resize_size(op, hw[0], hw[1], st->out);
        st->m[0] = w / (double)st->out[1];
        st->m[4] = h / (double)st->out[0];
        st->resamples = st->out[0] != hw[0] || st->out[1] != hw[1];
        params[0] = st->out[0], params[1] = st->out[1];
        break;
    case ING_CENTER_CROP: {
        int64_t top = centre_offset(hw[0], op->size[0]), left = centre_offset(hw[1], op->size[1]);
        st->m[2] = (double)left, st->m[5] = (double)top;
        st->out[0] = op->size[0], st->out[1] = op->size[1];
        st->crop[0] = (double)left, st->crop[1] = (double)top;
        st->crop[2] = (double)(left + op->size[1]), st->crop[3] = (double)(top + op->size[0]);
        st->cropped = 1;
        params[0] = st->out[0], params[1] = st->out[1];
        break;
    }
    case ING_RANDOM_RESIZED_CROP: {
        ing_resized_crop_keyed(key, call, hw[0], hw[1], op->scale, op->ratio, params);
        double top = (double)params[0], left = (double)params[1], ch = (double)params[2], cw = (double)params[3];
        st->m[0] = cw / (double)op->size[1], st->m[2] = left;
        st->m[4] = ch / (double)op->size[0], st->m[5] = top;
        st->out[0] = op->size[0], st->out[1] = op->size[1];
        st->crop[0] = left, st->crop[1] = top, st->crop[2] = left + cw, st->crop[3] = top + ch;
        st->cropped = 1;
        st->resamples = params[2] != op->size[0] || params[3] != op->size[1];
        break;
    }
    case ING_FLIP: {   /* Flip.draw: random(2), column 0 left-right, column 1 top-bottom */
        uint64_t c = ing_combine(key, call);
        int fx = op->horizontal && ing_unit(ing_combine(c, 0)) < op->p;
        int fy = op->vertical && ing_unit(ing_combine(c, 1)) < op->p;
        st->m[0] = fx ? -1.0 : 1.0, st->m[2] = fx ? w : 0.0;
        st->m[4] = fy ? -1.0 : 1.0, st->m[5] = fy ? h : 0.0;
        st->out[0] = hw[0], st->out[1] = hw[1];
        params[0] = fx, params[1] = fy;
        break;
    }
    case ING_ZOOM_OUT: {   /* ZoomOut.draw: random(4), the coin, the ratio, the position x and y */
        uint64_t c = ing_combine(key, call);
        double u[4];
        for (int j = 0; j < 4; ++j)
            u[j] = ing_unit(ing_combine(c, (uint64_t)j));
        double r = u[0] < op->p ? op->ratio[0] + u[1] * (op->ratio[1] - op->ratio[0]) : 1.0;
        int64_t ch = (int64_t)(h * r), cw = (int64_t)(w * r);
        int64_t left = (int64_t)((double)(cw - hw[1]) * u[2]), top = (int64_t)((double)(ch - hw[0]) * u[3]);
        translation(st, -(double)left, -(double)top, ch, cw);
        params[0] = left, params[1] = top, params[2] = ch, params[3] = cw;
        break;
    }
    case ING_IOU_CROP: {
        const ing_iou_config c = {op->min_ious, op->n_ious, op->scale[0], op->scale[1], op->ratio[0], op->ratio[1],
                                  op->attempts, op->rounds};
        ing_iou_crop(key, call, hw[0], hw[1], boxes, nboxes, &c, params);
        translation(st, (double)params[1], (double)params[0], params[2], params[3]);
        break;
    }
    case ING_PAD_TO: {   /* PadTo._padded and _steps */
        int64_t out[2];
        for (int a = 0; a < 2; ++a) {
            out[a] = op->batch ? largest[a] : hw[a];
            out[a] = out[a] > op->size[a] ? out[a] : op->size[a];
            if (op->multiple)
                out[a] = (out[a] + op->multiple - 1) / op->multiple * op->multiple;
        }
        int64_t top = op->center ? (out[0] - hw[0]) / 2 : 0, left = op->center ? (out[1] - hw[1]) / 2 : 0;
        translation(st, -(double)left, -(double)top, out[0], out[1]);
        params[0] = out[0], params[1] = out[1];
        break;
    }
    }
}

/* The call numbers an op's draw takes (RandomResizedCrop's advance(2), Flip's and ZoomOut's random(k),
 * RandomIoUCrop's advance(1)). */
static uint64_t op_calls(const ing_op *op) {
    switch (op->kind) {
    case ING_RANDOM_RESIZED_CROP: return 2;
    case ING_FLIP: case ING_ZOOM_OUT: case ING_IOU_CROP: return 1;
    default: return 0;
    }
}

/* np.linalg.inv of an op's map (scales, translations, flips: m1 = m3 = 0), as LAPACK's LU inverse gives it for
 * these matrices (tested): 1 / a on the diagonal, -(t * (1 / a)) for the translation. */
static void inverse(const double m[9], double inv[9]) {
    identity(inv);
    inv[0] = 1.0 / m[0], inv[4] = 1.0 / m[4];
    inv[2] = -(m[2] * inv[0]), inv[5] = -(m[5] * inv[4]);
}

/* Sample k's boxes b (n of them, their input rows in `rows`) through one op (`st`, its `params`), compacted in
 * place (planner._Boxes.follow): RandomIoUCrop's filter, then the map, clip and drop of empty boxes. Returns how
 * many remain. */
static int64_t follow(const ing_op *op, const step *st, const int64_t params[ING_PARAMS], double *b, int64_t *rows,
                      int64_t n) {
    double inv[9];
    inverse(st->m, inv);
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (op->kind == ING_IOU_CROP && !ing_iou_keeps(b + 4 * i, params))
            continue;
        double r[4];
        if (!ing_map_box(b + 4 * i, inv, st->out, r))
            continue;
        memcpy(b + 4 * kept, r, sizeof r);
        rows[kept++] = rows[i];
    }
    return kept;
}

/* a @ b for 3x3 matrices, each entry summed left to right (numpy's matmul of these matrices, tested). */
static void matmul(const double a[9], const double b[9], double out[9]) {
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j)
            out[3 * i + j] = a[3 * i] * b[j] + a[3 * i + 1] * b[3 + j] + a[3 * i + 2] * b[6 + j];
}

static double min2(double a, double b) { return b < a ? b : a; }
static double max2(double a, double b) { return b > a ? b : a; }

/* affine.bounds, one row: the rectangle r (x0 y0 x1 y1) mapped by m, its four corners' min and max. */
static void bounds(const double m[9], const double r[4], double out[4]) {
    const double xs[4] = {r[0], r[2], r[2], r[0]}, ys[4] = {r[1], r[1], r[3], r[3]};
    for (int axis = 0; axis < 2; ++axis) {
        const double *row = m + 3 * axis;
        double p[4];
        for (int k = 0; k < 4; ++k)
            p[k] = row[0] * xs[k] + row[1] * ys[k] + row[2];
        out[axis] = min2(min2(min2(p[0], p[1]), p[2]), p[3]);
        out[axis + 2] = max2(max2(max2(p[0], p[1]), p[2]), p[3]);
    }
}

/* Sample s's state between ops (ing_plan keeps it in the sample's own record): the composed map so far as 3 x 3
 * (affine maps: the last row is 0 0 1). */
static void load_matrix(const ing_sample *s, double m[9]) {
    memcpy(m, s->matrix, 6 * sizeof *m);
    m[6] = 0.0, m[7] = 0.0, m[8] = 1.0;
}

/* ing_plan's start for sample s of probed size hw: no op yet. */
static void start_sample(ing_sample *s, const int64_t hw[2]) {
    const double whole[4] = {0.0, 0.0, (double)hw[1], (double)hw[0]};
    s->src_hw[0] = s->out_hw[0] = hw[0], s->src_hw[1] = s->out_hw[1] = hw[1];
    s->content_hw[0] = s->content_hw[1] = -1;   /* no padding op yet */
    const double eye[6] = {1.0, 0.0, 0.0, 0.0, 1.0, 0.0};
    memcpy(s->matrix, eye, sizeof eye);
    /* affine.compose: the box starts as the whole source; an op that resamples sets it to its input region (its
     * crop, else its whole input) mapped to the source. valid: what every op so far reads; inside: what the ops
     * after the last resample read */
    memcpy(s->box, whole, sizeof whole);
    memcpy(s->valid, whole, sizeof whole);
    memcpy(s->readable, whole, sizeof whole);
    s->inside[0] = s->inside[1] = -INFINITY, s->inside[2] = s->inside[3] = INFINITY;
}

/* Op j (its step `st` made) on sample s: affine.compose's regions and box, the composed map, the size, and
 * planner.plan's content size (the size before a run of padding ops that nothing after has resized). Returns
 * whether the op resampled the sample. */
static int compose_step(const ing_op *op, int j, const step *st, ing_sample *s) {
    double m[9], next[9];
    load_matrix(s, m);
    const int64_t cur[2] = {s->out_hw[0], s->out_hw[1]};
    if (op->kind == ING_PAD_TO) {
        if (s->content_hw[0] < 0)
            s->content_hw[0] = cur[0], s->content_hw[1] = cur[1];
    } else {
        s->content_hw[0] = s->content_hw[1] = -1;
    }
    double whole_input[4] = {0.0, 0.0, (double)cur[1], (double)cur[0]};
    const double *regions[2];
    int nregions = 0;
    if (j)
        regions[nregions++] = whole_input;
    if (st->cropped)
        regions[nregions++] = st->crop;
    for (int r = 0; r < nregions; ++r) {
        double mapped[4];
        if (j)
            bounds(m, regions[r], mapped);
        else
            memcpy(mapped, regions[r], sizeof mapped);
        for (int c = 0; c < 2; ++c) {
            s->valid[c] = max2(s->valid[c], mapped[c]), s->valid[c + 2] = min2(s->valid[c + 2], mapped[c + 2]);
            s->inside[c] = max2(s->inside[c], mapped[c]);
            s->inside[c + 2] = min2(s->inside[c + 2], mapped[c + 2]);
        }
    }
    if (st->resamples) {
        bounds(m, st->cropped ? st->crop : whole_input, s->box);
        memcpy(s->readable, s->valid, sizeof s->valid);
        s->inside[0] = s->inside[1] = -INFINITY, s->inside[2] = s->inside[3] = INFINITY;
    }
    if (j == 0) {
        memcpy(next, st->m, sizeof next);
    } else {
        matmul(m, st->m, next);
    }
    memcpy(s->matrix, next, 6 * sizeof *next);
    s->out_hw[0] = st->out[0], s->out_hw[1] = st->out[1];
    return st->resamples;
}

/* Sample k's boxes (n at b, their rows at `rows`) less those narrower or lower than min_size (> 0), compacted:
 * Plan.map_box_batch's nonempty(boxes, min_size). Returns how many remain. */
static int64_t prune(double *b, int64_t *rows, int64_t n, double min_size) {
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
        const double *r = b + 4 * i, bw = r[2] - r[0], bh = r[3] - r[1];
        if (bw > 0 && bh > 0 && bw >= min_size && bh >= min_size) {
            memmove(b + 4 * kept, r, 4 * sizeof *r);
            rows[kept++] = rows[i];
        }
    }
    return kept;
}

int ing_plan(const ing_chain *chain, int64_t n, const int64_t *index, int64_t epoch, const int64_t *hw,
             ing_plan_out *plan) {
    if (!chain || !plan || n < 0 || (n && (!(index || plan->keys) || !hw || !plan->sample)))
        return ING_EINVAL;
    if (epoch < 0 && !plan->keys)
        return ING_ESIZE;
    for (int64_t k = 0; k < n; ++k)
        if ((!plan->keys && index[k] < 0) || !fits(hw + 2 * k))
            return ING_ESIZE;
    ing_boxes *boxes = plan->boxes;
    if (boxes && n && (!boxes->counts || !boxes->kept_counts || !(boxes->min_size >= 0.0)))
        return ING_EINVAL;
    int64_t total = 0;   /* the boxes given */
    for (int64_t k = 0; boxes && k < n; ++k) {
        if (boxes->counts[k] < 0)
            return ING_EINVAL;
        total += boxes->counts[k];
    }
    if (boxes && total && (!boxes->in || !boxes->out || !boxes->kept))
        return ING_EINVAL;
    /* Op by op over the samples (a batch-wide PadTo needs every sample's size before it); each sample's state
     * lives in its record, its boxes at its input rows of boxes->out (planner._Boxes), their count in
     * kept_counts, until the end compacts them. */
    for (int64_t k = 0; k < n; ++k) {
        start_sample(&plan->sample[k], hw + 2 * k);
        if (boxes)
            boxes->kept_counts[k] = boxes->counts[k];
    }
    if (total) {
        memcpy(boxes->out, boxes->in, (size_t)(4 * total) * sizeof *boxes->out);
        for (int64_t i = 0; i < total; ++i)
            boxes->kept[i] = i;
    }
    uint64_t prefix = plan->keys ? 0 : ing_prefix(chain->seed, (uint64_t)epoch), call = 0;
    int resampler = -1;   /* the last op that resamples any sample (affine.compose) */
    for (int j = 0; j < chain->nops; ++j) {
        const ing_op *op = &chain->ops[j];
        int64_t largest[2] = {0, 0};   /* PadTo(batch=True): the batch's largest height and width */
        for (int64_t k = 0; op->batch && k < n; ++k)
            for (int a = 0; a < 2; ++a)
                largest[a] = plan->sample[k].out_hw[a] > largest[a] ? plan->sample[k].out_hw[a] : largest[a];
        int64_t first = 0;   /* sample k's first box row */
        for (int64_t k = 0; k < n; ++k) {
            ing_sample *s = &plan->sample[k];
            uint64_t key = plan->keys ? plan->keys[k] : ing_combine(prefix, (uint64_t)index[k]);
            int64_t unused[ING_PARAMS];
            int64_t *params = plan->params ? plan->params + ING_PARAMS * (k * chain->nops + j) : unused;
            double *b = boxes ? boxes->out + 4 * first : NULL;
            int64_t nb = boxes ? boxes->kept_counts[k] : 0;
            step st;
            memset(&st, 0, sizeof st);   /* every field read below is set by op_step; this says so */
            op_step(op, s->out_hw, largest, key, call, b, nb, &st, params);
            if (nb)
                boxes->kept_counts[k] = follow(op, &st, params, b, boxes->kept + first, nb);
            if (compose_step(op, j, &st, s) && j > resampler)
                resampler = j;
            first += boxes ? boxes->counts[k] : 0;
        }
        call += op_calls(op);
    }
    int64_t first = 0, written = 0;
    for (int64_t k = 0; k < n; ++k) {
        ing_sample *s = &plan->sample[k];
        if (s->content_hw[0] < 0)
            s->content_hw[0] = s->out_hw[0], s->content_hw[1] = s->out_hw[1];
        if (boxes) {   /* the kept boxes after those of the samples before */
            int64_t nb = boxes->kept_counts[k];
            if (boxes->min_size > 0)
                nb = prune(boxes->out + 4 * first, boxes->kept + first, nb, boxes->min_size);
            if (nb && written != first) {
                memmove(boxes->out + 4 * written, boxes->out + 4 * first, (size_t)(4 * nb) * sizeof *boxes->out);
                memmove(boxes->kept + written, boxes->kept + first, (size_t)nb * sizeof *boxes->kept);
            }
            boxes->kept_counts[k] = nb;
            written += nb;
            first += boxes->counts[k];
        }
        /* Warp.regions: floor / ceil of the box, clipped to the image */
        double lo[2] = {floor(s->box[0]), floor(s->box[1])}, hi[2] = {ceil(s->box[2]), ceil(s->box[3])};
        for (int a = 0; a < 2; ++a) {
            int64_t l = (int64_t)lo[a], h = (int64_t)hi[a], size = s->src_hw[1 - a];
            s->region[a] = l > 0 ? l : 0;
            s->region[2 + a] = h < size ? h : size;
        }
    }
    if (resampler < 0) {
        plan->interpolation = ING_NEAREST;
        plan->antialias = 0;
    } else {
        plan->interpolation = chain->ops[resampler].interpolation;
        plan->antialias = chain->ops[resampler].antialias;
    }
    return ING_OK;
}

int64_t ing_out_elements(const ing_chain *chain, int64_t n, const ing_plan_out *plan) {
    int64_t total = 0;
    for (int64_t k = 0; k < n; ++k)
        total += plan->sample[k].out_hw[0] * plan->sample[k].out_hw[1] * chain->channels;
    return total;
}

/* ---------------------------------------------------------------------------------------------- packing */

/* affine._dct_scale, one row: (sx, sy) = k/8 where a JPEG decoder scaling by k/8 gives exactly `arrived`
 * from `probed` (the largest such k), else the plain size ratio per axis. */
static void dct_scale(const int64_t probed[2], const int64_t arrived[2], double s[2]) {
    s[0] = (double)arrived[1] / (double)(probed[1] > 1 ? probed[1] : 1);
    s[1] = (double)arrived[0] / (double)(probed[0] > 1 ? probed[0] : 1);
    for (int k = 1; k <= 8; ++k) {
        int exact = 1;
        for (int a = 0; a < 2; ++a)
            exact &= ceil((double)(probed[a] * k) / 8.0 - 1e-9) == (double)arrived[a];
        if (exact)
            s[0] = s[1] = (double)k / 8.0;
    }
}

/* resample._narrowed, one sample: `box` cut to `inside` on a side where the output maps past it, and the
 * `window` (x0 y0 x1 y1, in: the whole image) narrowed to `readable` where the taps reach past it inside the
 * image; `m` and `box` then relative to the window's corner. */
static void narrow(double m[6], const int64_t out_hw[2], const double inside[4], const double readable[4],
                   double box[4], int64_t window[4]) {
    const double eps = 1e-6;
    const double full[9] = {m[0], m[1], m[2], m[3], m[4], m[5], 0.0, 0.0, 1.0};
    const double out[4] = {0.0, 0.0, (double)out_hw[1], (double)out_hw[0]};
    double seen[4];
    bounds(full, out, seen);
    for (int j = 0; j < 4; ++j) {
        double side = j < 2 ? 1.0 : -1.0;
        if (side * (inside[j] - seen[j]) > eps && side * (inside[j] - box[j]) > eps)
            box[j] = inside[j];
    }
    int64_t kept[4], reach[4];
    for (int j = 0; j < 4; ++j) {
        if (j < 2) {
            kept[j] = (int64_t)max2(floor(readable[j] + eps), 0.0);
            reach[j] = (int64_t)max2(floor(box[j] + eps), 0.0);
        } else {
            kept[j] = (int64_t)min2(ceil(readable[j] - eps), (double)window[j]);
            reach[j] = (int64_t)min2(ceil(box[j] - eps), (double)window[j]);
        }
    }
    int beyond = reach[0] < kept[0] || reach[1] < kept[1] || reach[2] > kept[2] || reach[3] > kept[3];
    if (!(reach[2] > reach[0] && reach[3] > reach[1] && beyond))
        return;
    if (kept[2] <= kept[0] || kept[3] <= kept[1])   /* nothing kept: all fill */
        box[0] = box[1] = box[2] = box[3] = 0.0;
    window[0] = kept[0], window[1] = kept[1];
    window[2] = kept[2] > kept[0] ? kept[2] : kept[0], window[3] = kept[3] > kept[1] ? kept[3] : kept[1];
    m[2] -= (double)window[0], m[5] -= (double)window[1];
    box[0] -= (double)window[0], box[2] -= (double)window[0];
    box[1] -= (double)window[1], box[3] -= (double)window[1];
}

int ing_pack(const ing_chain *chain, int64_t n, const ing_plan_out *plan, const int64_t *origins,
             const int64_t *decoded_hw, const uint64_t *src, const int64_t *src_strides, int64_t *ip, double *fp,
             int32_t grid[3]) {
    if (!chain || n < 0 || !plan || !ip || !fp || !grid || (n && (!plan->sample || !decoded_hw || !src)))
        return ING_EINVAL;
    for (int64_t k = 0; k < n; ++k)
        if (!fits(decoded_hw + 2 * k))
            return ING_ESIZE;
    const int64_t c = chain->channels;
    memset(ip, 0, (size_t)(16 * n) * sizeof *ip);
    memset(fp, 0, (size_t)(16 * (n + 1)) * sizeof *fp);
    for (int j = 0; j < c; ++j) {
        fp[j] = chain->fill[j];
        if (chain->normalize)
            fp[4 + j] = chain->a[j], fp[8 + j] = chain->b[j];
    }
    /* resample._setup's constants */
    const double eps = 1e-6, tiny = 1e-9, factor = plan->interpolation == ING_BICUBIC ? 2.0 : 1.0;
    int64_t offset = 0, max_h = 0, max_w = 0;
    for (int64_t k = 0; k < n; ++k) {
        const ing_sample *s = &plan->sample[k];
        const int64_t *dhw = decoded_hw + 2 * k;
        int64_t *I = ip + 16 * k;
        double *P = fp + 16 * (k + 1), *m = P, *box = P + 6;
        memcpy(m, s->matrix, 6 * sizeof *m);
        double inside[4], readable[4];
        memcpy(box, s->box, 4 * sizeof *box);
        memcpy(inside, s->inside, sizeof inside);
        memcpy(readable, s->readable, sizeof readable);
        if (origins) {   /* Warp.shifted(origins), then rescaled at 1.0: a no-op on the numbers */
            double ox = (double)origins[2 * k], oy = (double)origins[2 * k + 1];
            m[2] -= ox, m[5] -= oy;
            for (int a = 0; a < 4; a += 2) {
                box[a] -= ox, box[a + 1] -= oy, inside[a] -= ox, inside[a + 1] -= oy;
                readable[a] -= ox, readable[a + 1] -= oy;
            }
        } else if (dhw[0] != s->src_hw[0] || dhw[1] != s->src_hw[1]) {   /* Warp.rescaled(decoded_hw) */
            double sc[2];
            dct_scale(s->src_hw, dhw, sc);
            for (int j = 0; j < 3; ++j)
                m[j] *= sc[0], m[3 + j] *= sc[1];
            for (int a = 0; a < 4; ++a)
                box[a] *= sc[a % 2], inside[a] *= sc[a % 2], readable[a] *= sc[a % 2];
        }
        int64_t window[4] = {0, 0, dhw[1], dhw[0]};
        narrow(m, s->out_hw, inside, readable, box, window);
        /* resample._setup */
        double a00 = fabs(m[0]), a01 = fabs(m[1]), a10 = fabs(m[3]), a11 = fabs(m[4]);
        int aligned = (a01 < tiny && a10 < tiny) || (a00 < tiny && a11 < tiny);
        int aa = aligned && plan->antialias && plan->interpolation != ING_NEAREST;
        double scale_x = max2(a00 + a01, 1.0), scale_y = max2(a10 + a11, 1.0);
        P[10] = scale_x * factor, P[11] = scale_y * factor;
        P[12] = 1.0 / scale_x, P[13] = 1.0 / scale_y;
        /* _warp_kernel.pack */
        I[0] = (int64_t)src[k];
        I[1] = offset;
        if (src_strides) {
            I[4] = src_strides[3 * k], I[5] = src_strides[3 * k + 1], I[6] = src_strides[3 * k + 2];
        } else {
            I[4] = dhw[1] * c, I[5] = c, I[6] = 1;
        }
        I[0] += window[1] * I[4] + window[0] * I[5];   /* the window's corner, its size */
        I[2] = window[3] - window[1], I[3] = window[2] - window[0];
        I[7] = (int64_t)floor(box[0] + eps), I[8] = (int64_t)floor(box[1] + eps);
        I[9] = (int64_t)ceil(box[2] - eps), I[10] = (int64_t)ceil(box[3] - eps);
        I[11] = s->out_hw[0], I[12] = s->out_hw[1];
        I[13] = aa;
        offset += s->out_hw[0] * s->out_hw[1] * c;
        if (s->out_hw[0] > max_h)
            max_h = s->out_hw[0];
        if (s->out_hw[1] > max_w)
            max_w = s->out_hw[1];
    }
    grid[0] = (int32_t)((max_w + BLOCK_X - 1) / BLOCK_X);
    grid[1] = (int32_t)((max_h + BLOCK_Y - 1) / BLOCK_Y);
    grid[2] = (int32_t)n;
    return ING_OK;
}
