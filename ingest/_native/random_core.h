/* The arithmetic of `ingest.random` (sample keys and uniform numbers) and RandomResizedCrop's procedure, shared
 * by ingest/_random.c (a batch's numbers for the Python planner) and ingest/_native/plan.c (the native one), so
 * that both draw the same numbers from one definition. Compile with -ffp-contract=off: the crop's arithmetic
 * must round as numpy's does. Every number is uint64, wrapping:
 *
 *   mix(x)          splitmix64's finalizer
 *   combine(h, v)   mix(h ^ mix(v + GOLDEN))
 *   key             combine(prefix(seed, epoch), dataset index)   (random.sample_keys, seed and epoch < 2**64)
 *   h               combine(key, call)                            the call's hash
 *   bits[j]         combine(h, j)                                 (k numbers), or mix(h) (one)
 *   unit(bits)      (bits >> 11) * 2**-53                         a double in [0, 1), exact
 */
#ifndef INGEST_NATIVE_RANDOM_CORE_H
#define INGEST_NATIVE_RANDOM_CORE_H

#include <math.h>
#include <stdint.h>

#define ING_GOLDEN 0x9E3779B97F4A7C15ULL

static inline uint64_t ing_mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static inline uint64_t ing_combine(uint64_t h, uint64_t v) { return ing_mix(h ^ ing_mix(v + ING_GOLDEN)); }

static inline double ing_unit(uint64_t x) { return (double)(x >> 11) * 0x1.0p-53; }

/* random._prefix(seed, epoch) for a seed and epoch below 2**64: the hash of their words (one each) and the
 * seed's word count (1). A sample's key is ing_combine(prefix, dataset index). */
static inline uint64_t ing_prefix(uint64_t seed, uint64_t epoch) {
    return ing_combine(ing_combine(ing_combine(0, seed), 1), epoch);
}

/* `ingest.ops.geometry.RandomResizedCrop.draw` for one sample of h x w (each >= 1): torchvision's procedure (10
 * attempts, then the whole image narrowed to the nearest allowed aspect), in the operations and order of that
 * method's numpy form. u: the 20 numbers of its first call (10 areas, 10 log-aspects), at: the 2 of its second
 * (the position). out: top, left, height, width. */
static inline void ing_resized_crop(int64_t h, int64_t w, const double *u, const double *at, const double scale[2],
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

/* ing_resized_crop with its numbers drawn from `key`: calls `call` (20 numbers) and `call + 1` (2). */
static inline void ing_resized_crop_keyed(uint64_t key, uint64_t call, int64_t h, int64_t w, const double scale[2],
                                          const double ratio[2], int64_t *out) {
    double u[20], at[2];
    uint64_t first = ing_combine(key, call), second = ing_combine(key, call + 1);
    for (int j = 0; j < 20; ++j)
        u[j] = ing_unit(ing_combine(first, (uint64_t)j));
    for (int j = 0; j < 2; ++j)
        at[j] = ing_unit(ing_combine(second, (uint64_t)j));
    ing_resized_crop(h, w, u, at, scale, ratio, out);
}

#endif
