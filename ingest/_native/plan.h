/* A batch's op chain in C: per-sample draws, the composed warp, the regions to decode and the warp kernel's
 * argument rows, exactly as the Python planner makes them (ingest/ops/planner.py `plan`, affine.py `compose`,
 * resample.py `_setup`, _warp_kernel.py `pack`), and with boxes the kept boxes (`Plan.map_box_batch`), for
 * these chains:
 *
 *   any sequence of Resize (with `max_size`), CenterCrop, RandomResizedCrop, Flip (HorizontalFlip,
 *   VerticalFlip), ZoomOut, RandomIoUCrop (at most ING_MAX_IOUS thresholds) and PadTo (a size, a multiple, the
 *   batch's largest image: batch=True), at least one, optionally followed by Normalize (the warp's epilogue):
 *   the classification chains and the detection ones (SSD's ZoomOut + RandomIoUCrop + HorizontalFlip +
 *   Resize(800, max_size=1333), with PadTo(multiple=32) or PadTo(multiple=32, batch=True), Normalize or not).
 *
 * Anything else is described by no chain (`ingest.native_plan.describe` returns None) and runs on the Python
 * stages. Same seed, epoch, dataset indices (or sample keys), probed sizes and boxes give the same draws, output
 * sizes and regions as the Python planner, the same kept boxes and the same `ip` rows; `fp` rows are the same
 * doubles (see `ing_pack`). One warp per batch with the chain's last fill: a chain whose ops' fills differ may
 * plan otherwise in Python (its warps split where an op padded), and its callers refuse such chains.
 *
 * Use, per batch (no globals: any number of threads may plan and pack different batches at once; nothing is
 * allocated, every array is the caller's):
 *
 *   ing_chain chain;   ing_chain_parse(&chain, desc, len, seed)               once, from the Python description
 *   ing_plan(&chain, n, index, epoch, probed_hw, &plan)                       draws; plan.sample[k].region to decode
 *   ... decode sample k's region (or the whole image) ...
 *   ing_pack(&chain, n, &plan, origins, decoded_hw, src, strides, ip, fp, grid)  the kernel's arguments
 *   launch warp_{nearest,bilinear,bicubic}[plan.interpolation](ip, fp, out, chain.channels, chain.kind,
 *          chain.nchw, chain.normalize) on grid x (32, 8, 1) threads, `out` holding
 *          ing_out_elements(&chain, n, &plan) elements of chain.kind (samples one after another)
 *
 * Detection (boxes): point plan.boxes at an ing_boxes holding the batch's boxes (x0 y0 x1 y1 in pixels of the
 * probed images, after the reader's format is converted: engine/boxes.py `_to_ltrb`) and per-sample counts, with
 * room for as many out. RandomIoUCrop's draw depends on them (its IoU and centre rules), so they must be given
 * to ing_plan, before decoding; ing_plan returns each sample's kept boxes in output pixels and each one's row
 * among those given, which gathers the per-box fields (labels, iscrowd, area, mask ids). Output sizes then vary
 * per sample (Resize's max_size, PadTo's multiple): out_hw[k] per sample, content_hw[k] the size before the
 * trailing PadTo (image_sizes). What an engine still does itself: the boxes to the format asked for
 * (`boxes.from_ltrb`), the per-box fields gathered by `kept`, and a ragged output (offsets per sample, as the
 * warp writes them) with the boxes and fields collated per batch.
 *
 * ing_chain_parse, ing_plan and ing_pack return ING_OK (0) or a negative error code (`ing_strerror`); on error
 * their outputs are unspecified. Built with -ffp-contract=off: every double operation rounds on its own, as numpy's do.
 */
#ifndef INGEST_NATIVE_PLAN_H
#define INGEST_NATIVE_PLAN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    ING_OK = 0,
    ING_EINVAL = -1,        /* a malformed description or argument (a NULL array, n < 0, ...) */
    ING_EUNSUPPORTED = -2,  /* a description of something this planner does not run (an unknown op, version) */
    ING_ESIZE = -3,         /* a probed or decoded side below 1 or above 2**31 - 1, or a dataset index or
                               epoch below 0 */
};

/* Interpolation codes: the kernel's NEAREST / BILINEAR / BICUBIC (kernel function warp_nearest, ...). */
enum { ING_NEAREST = 0, ING_BILINEAR = 1, ING_BICUBIC = 2 };

/* Op kinds of a description record. */
enum { ING_RESIZE = 1, ING_CENTER_CROP = 2, ING_RANDOM_RESIZED_CROP = 3, ING_FLIP = 4, ING_ZOOM_OUT = 5,
       ING_IOU_CROP = 6, ING_PAD_TO = 7 };

/* Resize modes (which of Resize's arguments was given). */
enum { ING_RESIZE_SIZE = 0, ING_RESIZE_SHORTER = 1, ING_RESIZE_LONGER = 2 };

#define ING_MAX_OPS 16   /* geometry ops in one chain */
#define ING_RECORD 16    /* doubles per record of a description */
#define ING_DESC_VERSION 1
#define ING_PARAMS 5      /* drawn parameters per op and sample (ing_plan_out.params) */
#define ING_MAX_IOUS 8    /* RandomIoUCrop's thresholds */

/* One geometry op's configuration (the fields its kind uses; the others are zero). */
typedef struct {
    int32_t kind;           /* ING_RESIZE, ... */
    int32_t interpolation;  /* Resize, RandomResizedCrop: ING_NEAREST, ... */
    int32_t antialias;      /* Resize, RandomResizedCrop: 0 or 1 */
    int32_t mode;           /* Resize: ING_RESIZE_SIZE (size = (h, w)), _SHORTER or _LONGER (length = size[0]) */
    int64_t size[2];        /* Resize: (h, w) or the side's length in size[0]; CenterCrop, RandomResizedCrop:
                               the output (h, w) */
    int64_t max_size;       /* Resize with ING_RESIZE_SHORTER: the longer side's cap, 0 for none */
    double scale[2];        /* RandomResizedCrop: area fraction (min, max); RandomIoUCrop: side fraction */
    double ratio[2];        /* RandomResizedCrop, RandomIoUCrop: aspect w / h (min, max); ZoomOut: canvas ratio */
    double p;               /* Flip: the probability of each flip; ZoomOut: of a canvas */
    int32_t horizontal;     /* Flip: left-right flips drawn (0 or 1) */
    int32_t vertical;       /* Flip: top-bottom flips drawn (0 or 1) */
    int32_t center;         /* PadTo: 1 pads around the centre, 0 at the bottom and right */
    int32_t batch;          /* PadTo: 1 pads every image to the batch's largest first */
    int64_t multiple;       /* PadTo: pad up to a multiple of it, 0 for none (size[]: at least that, 0 for none) */
    int64_t attempts;       /* RandomIoUCrop: crops tried per round */
    int64_t rounds;         /* RandomIoUCrop: thresholds tried */
    int32_t n_ious;         /* RandomIoUCrop: 1..ING_MAX_IOUS thresholds in min_ious, NaN for None (no crop) */
    double min_ious[ING_MAX_IOUS];
} ing_op;

/* A whole chain: the geometry ops in order, then the warp's fill and epilogue. */
typedef struct {
    int32_t nops;              /* 1..ING_MAX_OPS */
    int32_t channels;          /* 1..4: the decoded images' channels (the kernel's C) */
    ing_op ops[ING_MAX_OPS];
    double fill[4];            /* per channel, whole levels: the last CenterCrop's fill (else 0), as
                                  resample._fill_values gives it (fp row 0, 0..3) */
    int32_t normalize;         /* 1: Normalize follows (a, b used: out = v * a + b); 0: none (uint8 out) */
    int32_t kind;              /* output dtype, _warp_kernel._KINDS: 0 uint8, 1 float32, 2 float16, 3 bfloat16 */
    int32_t nchw;              /* 1: NCHW output, 0: NHWC */
    double a[4], b[4];         /* Normalize.epilogue(channels): per channel (fp row 0, 4..7 and 8..11) */
    uint64_t seed;             /* the loader's seed: sample keys hash (seed, epoch, dataset index) */
} ing_chain;

/* ing_chain_parse: `desc` (len doubles, as `ingest.native_plan.describe` writes it) into `chain`.
 *
 * A description is records of ING_RECORD doubles (integers held exactly). Record 0, the header:
 *   [0] ING_DESC_VERSION  [1] nops  [2] channels  [3] normalize  [4] kind  [5] nchw  [6..9] a[4]  [10..13] b[4]
 * record 1: fill[0..3], per channel in whole levels (resample._fill_values of the chain's fill),
 * then one record per op, field [0] its kind:
 *   ING_RESIZE               [1] mode [2] size h (or length) [3] size w [4] max_size [5] interpolation [6] antialias
 *   ING_CENTER_CROP          [1] h [2] w
 *   ING_RANDOM_RESIZED_CROP  [1] h [2] w [3] scale min [4] scale max [5] ratio min [6] ratio max
 *                            [7] interpolation [8] antialias
 *   ING_FLIP                 [1] p [2] horizontal [3] vertical
 *   ING_ZOOM_OUT             [1] ratio min [2] ratio max [3] p
 *   ING_IOU_CROP             [1] scale min [2] scale max [3] aspect min [4] aspect max [5] attempts [6] rounds
 *                            [7] thresholds (1..ING_MAX_IOUS) [8..] the thresholds, NaN for None
 *   ING_PAD_TO               [1] size h [2] size w (0 0: none) [3] multiple (0: none) [4] center [5] batch
 * so len = ING_RECORD * (2 + nops). Returns ING_EINVAL for a malformed one, ING_EUNSUPPORTED for another
 * version or an unknown op kind. */
int ing_chain_parse(ing_chain *chain, const double *desc, int64_t len, uint64_t seed);

/* One sample's plan. Coordinates are continuous pixel coordinates of the PROBED source (pixel (i, j) covers
 * [j, j+1) x [i, i+1)). */
typedef struct {
    int64_t region[4];   /* x0 y0 x1 y1 (end exclusive): the source pixels the warp can read, clipped to the
                            image: Warp.regions(). The decoder may decode just these (or the whole image) */
    int64_t out_hw[2];   /* output height, width */
    int64_t content_hw[2];  /* the size before the chain's trailing PadTo ops (out_hw when it ends otherwise):
                               where the image lies in a padded output (image_sizes) */
    int64_t src_hw[2];   /* the probed size it was planned for (height, width) */
    double matrix[6];    /* output coords -> source coords: x = m0 x' + m1 y' + m2, y = m3 x' + m4 y' + m5 */
    double box[4];       /* x0 y0 x1 y1: the source region the resample may read (Warp.box) */
    double inside[4];    /* Warp.inside: where output points may map (+-inf: unbounded) */
    double readable[4];  /* Warp.readable: the source pixels the last resampling op's input holds */
    double valid[4];     /* Warp.valid: what every op of the chain reads of its input (masks' box) */
} ing_sample;

/* A batch's boxes (detection), all arrays the caller's: what ing_plan reads and writes when given them. Each
 * sample's boxes go through the chain as the Python planner's (`Plan.map_box_batch`): RandomIoUCrop draws on
 * them as mapped so far and keeps those whose centre its crop holds; every op maps them (corners through its
 * inverse map, the bounding box clipped to its output) and drops the empty ones; at the end those narrower or
 * lower than min_size are dropped too. */
typedef struct {
    const double *in;         /* M x 4: x0 y0 x1 y1 in pixels of the probed source, sample after sample */
    const int64_t *counts;    /* n: each sample's number of boxes (>= 0; M is their sum) */
    double min_size;          /* > 0: the smallest width and height kept at the end; 0: any nonempty box */
    double *out;              /* M x 4, written: the kept boxes in output pixels, sample after sample (the first
                                 sum(kept_counts) rows; may not be `in`) */
    int64_t *kept;            /* M, written: each kept box's row in `in` (to gather its labels and other fields) */
    int64_t *kept_counts;     /* n, written: each sample's kept boxes */
} ing_boxes;

/* A batch's plan: the caller points `sample` at n ing_sample and `params` at n * nops * ING_PARAMS int64 (or
 * NULL). */
typedef struct {
    ing_sample *sample;     /* n, written */
    int64_t *params;        /* NULL, or n x nops x ING_PARAMS, written: each op's drawn parameters for sample k at
                               [k][op][..] (0 where unused): RandomResizedCrop top, left, height, width (its
                               Python params); Flip left-right, top-bottom (0/1); ZoomOut left, top, canvas
                               height, width; RandomIoUCrop top, left, height, width, cropped (its Python
                               params); Resize, CenterCrop, PadTo output h, w */
    ing_boxes *boxes;       /* NULL (no boxes: RandomIoUCrop keeps every image whole), or the batch's boxes */
    const uint64_t *keys;   /* NULL, or n sample keys (random.sample_keys) to draw from instead of those of
                               (chain seed, epoch, index[k]), which are then not read */
    int32_t interpolation;  /* written: the batch's filter, from the last op that resamples any of its samples
                               (ING_NEAREST, antialias 0, when none does), as affine.compose picks it */
    int32_t antialias;      /* written */
} ing_plan_out;

/* ing_plan: every op's draws and the composed warp for n samples: dataset indices `index` (n, >= 0) of `epoch`
 * (>= 0), probed sizes `hw` (n x 2: height, width, each in 1 .. 2**31 - 1). What planner.plan(ops, hw,
 * SampleRandom.keyed(seed, epoch, index)).warp holds, per sample; draws depend only on (seed, epoch, index[k],
 * hw[k]) and the ops (and RandomIoUCrop's on the sample's boxes); a batch-wide PadTo's size on every sample's
 * size before it (the plan of a batch is not that of its slices). With plan->boxes, also
 * planner.plan(..., boxes=...).map_box_batch(min_size=...): the kept boxes and their rows (ing_boxes). */
int ing_plan(const ing_chain *chain, int64_t n, const int64_t *index, int64_t epoch, const int64_t *hw,
             ing_plan_out *plan);

/* The output elements of sample k (out_hw h * w * channels) summed over the batch: the output buffer's size. */
int64_t ing_out_elements(const ing_chain *chain, int64_t n, const ing_plan_out *plan);

/* ing_pack: the warp kernel's argument rows for the decoded batch (_warp_kernel.pack's `ip`, `fp`, `grid`).
 *
 *   origins     NULL, or n x 2 (x0, y0): where the decoded pixels start in the probed image (a region decode;
 *               (0, 0) for a whole one). Given, the warp is shifted by them and read 1:1 at the decoded sizes
 *               (planner.Stage.run: `warp.shifted(origins).rescaled(decoded_hw, 1.0)`, the GPU decoder's case).
 *               NULL: whole images, rescaled from the probed size when `decoded_hw` differs (by k/8 when it is
 *               a JPEG DCT scaling, else the ratio: `warp.rescaled(decoded_hw)`), as planned when it does not.
 *   decoded_hw  n x 2: the decoded pixels' height, width (each in 1 .. 2**31 - 1)
 *   src         n device pointers to each sample's first decoded pixel (uint8)
 *   src_strides NULL (each image dense HWC: row w * C, column C, channel 1 bytes), or n x 3 byte strides of
 *               row, column, channel
 *   ip          n x 16 int64, written whole (unused columns 0); output offsets are dense in sample order
 *   fp          (n + 1) x 16 double, written whole
 *   grid        written: (ceil(max out w / 32), ceil(max out h / 8), n) for a (32, 8, 1) block; zeros if n == 0
 */
int ing_pack(const ing_chain *chain, int64_t n, const ing_plan_out *plan, const int64_t *origins,
             const int64_t *decoded_hw, const uint64_t *src, const int64_t *src_strides, int64_t *ip, double *fp,
             int32_t grid[3]);

/* A short constant message for an error code. */
const char *ing_strerror(int code);

#ifdef __cplusplus
}
#endif

#endif
