/* A detection sample's box work, shared by ingest/ops/_boxes.c (the Python planner's batch calls) and
 * ingest/_native/plan.c (the native planner), so that both draw and map boxes from one definition. Compile with
 * -ffp-contract=off: the arithmetic is numpy's, operation for operation in float64.
 *
 *   ing_iou_crop   `ingest.ops.detection.RandomIoUCrop.draw` for one sample
 *   ing_map_box    `ingest.ops.affine.map_boxes` and `nonempty` for one box
 */
#ifndef INGEST_NATIVE_BOXES_CORE_H
#define INGEST_NATIVE_BOXES_CORE_H

#include <stdint.h>

#include "random_core.h"

#define ING_SPAWN 0x535041574E000001ULL   /* ingest.random._SPAWN */

/* RandomIoUCrop's configuration: thresholds (NaN for None: no crop), scale and aspect ranges, trials. */
typedef struct {
    const double *choices;
    int64_t n_choices;
    double s0, s1, a0, a1;
    int64_t attempts, rounds;
} ing_iou_config;

/* Whether the crop (top, left, ch, cw) qualifies for `threshold` against boxes b[0..k-1]: some box has its
 * centre strictly inside and the best IoU among those is >= threshold (a NaN IoU makes the best NaN, as
 * numpy's max does, and then none qualifies). */
static inline int ing_iou_qualifies(const double *b, int64_t k, int64_t top, int64_t left, int64_t ch, int64_t cw,
                                    double threshold) {
    double x0 = (double)left, y0 = (double)top;
    double x1 = x0 + (double)cw, y1 = y0 + (double)ch;
    double area = (double)(cw * ch), best = -1.0;
    int inside = 0, nan = 0;
    for (int64_t j = 0; j < k; ++j, b += 4) {
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

/* RandomIoUCrop.draw for one sample of h x w with boxes b[0..k-1] (x0 y0 x1 y1): its rounds and their attempts
 * in order, stopping at the first crop that qualifies, with the numbers of the op's child source (spawned at
 * call `call` of the sample's `key`; round r draws from that child's r-th spawn: call 0 the threshold, call 1
 * four numbers per attempt). out: top, left, height, width, cropped; left as the whole image (0, 0, h, w, 0)
 * when none qualifies. */
static inline void ing_iou_crop(uint64_t key, uint64_t call, int64_t h, int64_t w, const double *b, int64_t k,
                                const ing_iou_config *c, int64_t out[5]) {
    out[0] = 0, out[1] = 0, out[2] = h, out[3] = w, out[4] = 0;
    if (k == 0)
        return;
    uint64_t rounds = ing_combine(ing_combine(key, call), ING_SPAWN);
    for (int64_t r = 0; r < c->rounds; ++r) {
        uint64_t rk = ing_combine(ing_combine(rounds, (uint64_t)r), ING_SPAWN);
        int64_t span = c->n_choices, pick = (int64_t)(ing_unit(ing_mix(ing_combine(rk, 0))) * (double)span);
        double threshold = c->choices[pick < span - 1 ? pick : span - 1];
        if (threshold != threshold)   /* None: the image stays whole */
            return;
        uint64_t draws = ing_combine(rk, 1);
        for (int64_t a = 0; a < c->attempts; ++a) {
            double u[4];
            for (int j = 0; j < 4; ++j)
                u[j] = ing_unit(ing_combine(draws, (uint64_t)(4 * a + j)));
            int64_t cw = (int64_t)((double)w * (c->s0 + (c->s1 - c->s0) * u[0]));
            int64_t ch = (int64_t)((double)h * (c->s0 + (c->s1 - c->s0) * u[1]));
            int64_t left = (int64_t)((double)(w - cw) * u[2]);
            int64_t top = (int64_t)((double)(h - ch) * u[3]);
            if (!(cw > 0 && ch > 0 && c->a0 * (double)ch <= (double)cw && (double)cw <= c->a1 * (double)ch))
                continue;
            if (ing_iou_qualifies(b, k, top, left, ch, cw, threshold)) {
                out[0] = top, out[1] = left, out[2] = ch, out[3] = cw, out[4] = 1;
                return;
            }
        }
    }
}

/* RandomIoUCrop.box_filter for one box: kept when the crop (top, left, ch, cw, cropped) holds its centre
 * strictly, or when the image stayed whole. */
static inline int ing_iou_keeps(const double b[4], const int64_t crop[5]) {
    double cx = (b[0] + b[2]) / 2, cy = (b[1] + b[3]) / 2;
    return crop[4] == 0 || ((double)crop[1] < cx && cx < (double)(crop[1] + crop[3]) && (double)crop[0] < cy &&
                            cy < (double)(crop[0] + crop[2]));
}

/* numpy's minimum and maximum: NaN if either is, else the smaller (larger); the first when they compare equal. */
static inline double ing_nanmin(double a, double b) { return a <= b || a != a ? a : b; }
static inline double ing_nanmax(double a, double b) { return a >= b || a != a ? a : b; }

/* One box (x0 y0 x1 y1) through an op whose inverse map (output = inv @ input, 3 x 3 row-major, the last row
 * not read) is `inv` and whose output is `out_hw` (height, width): its four corners mapped, their bounding box
 * clipped to the output (np.clip: NaN kept) into `r`. Returns whether it is nonempty (width and height > 0). */
static inline int ing_map_box(const double b[4], const double inv[9], const int64_t out_hw[2], double r[4]) {
    double x0 = b[0], y0 = b[1], x1 = b[2], y1 = b[3];
    for (int axis = 0; axis < 2; ++axis) {
        double p = inv[3 * axis], q = inv[3 * axis + 1], s = inv[3 * axis + 2];
        double c0 = p * x0 + q * y0 + s, c1 = p * x1 + q * y0 + s, c2 = p * x1 + q * y1 + s, c3 = p * x0 + q * y1 + s;
        double lim = (double)out_hw[1 - axis];
        double lo = ing_nanmin(ing_nanmin(ing_nanmin(c0, c1), c2), c3);
        double hi = ing_nanmax(ing_nanmax(ing_nanmax(c0, c1), c2), c3);
        lo = lo < 0.0 ? 0.0 : lo, lo = lo > lim ? lim : lo;
        hi = hi < 0.0 ? 0.0 : hi, hi = hi > lim ? lim : hi;
        r[axis] = lo, r[axis + 2] = hi;
    }
    return (r[2] - r[0] > 0) && (r[3] - r[1] > 0);
}

#endif
