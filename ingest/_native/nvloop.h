/* The per-image loop of one batched nvImageCodec decode, pure C (no Python, no nvImageCodec header). Included by
 * ingest/decode/_nvloop.c (the loop for Python's GpuDecoder) and the native engine (ingest/_native/engine.c), so
 * both drive nvImageCodec with one piece of code:
 *
 *   for each image: code stream over its bytes -> parse check (JPEG, JPEG 2000, TIFF) -> region view -> image wrapper
 *   then: one nvimgcodecDecoderDecode over every image that got that far -> wait -> processing statuses
 *
 * The functions arrive as addresses (ING_NV_* order, taken by ingest/decode/_nvimgcodec.py from the library) and
 * the struct fields written as offsets into caller-made struct arrays (ing_nv_slots), so this builds with any
 * C compiler. ing_nv_run fills out[i] with the processing status of image i (ING_NV_SUCCESS: decoded), or
 * ING_NV_OUT_PARSE | call status, ING_NV_OUT_NOT_JPEG (none of those codecs), ING_NV_OUT_DECODE | the batch decode call's status,
 * and returns the status of nvimgcodecDecoderDecode (0 when nothing reached it). The pixels are ready in order
 * on each image info's CUDA stream once it returns.
 */
#ifndef INGEST_NATIVE_NVLOOP_H
#define INGEST_NATIVE_NVLOOP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { ING_NV_CREATE, ING_NV_INFO, ING_NV_SUB, ING_NV_IMAGE, ING_NV_DECODE, ING_NV_WAIT, ING_NV_STATUS,
       ING_NV_FUTURE_DESTROY, ING_NV_COUNT };
#define ING_NV_SUCCESS 0x1u
#define ING_NV_OUT_PARSE 0x10000u
#define ING_NV_OUT_NOT_JPEG 0x20000u
#define ING_NV_OUT_DECODE 0x40000u

typedef int (*ing_nv_create_fn)(void *, void **, const unsigned char *, size_t, const void *);
typedef int (*ing_nv_info_fn)(void *, void *);
typedef int (*ing_nv_sub_fn)(void *, void **, const void *);
typedef int (*ing_nv_image_fn)(void *, void **, const void *);
typedef int (*ing_nv_decode_fn)(void *, void *const *, void *const *, int, const void *, void **);
typedef int (*ing_nv_future_fn)(void *);
typedef int (*ing_nv_status_fn)(void *, uint32_t *, size_t *);

typedef struct {
    ing_nv_create_fn create;
    ing_nv_info_fn info;
    ing_nv_sub_fn sub;
    ing_nv_image_fn image;
    ing_nv_decode_fn decode;
    ing_nv_future_fn wait;
    ing_nv_status_fn status;
    ing_nv_future_fn destroy;
} ing_nv_functions;

/* Whether a code stream of nvImageCodec's codec `name` is decoded here: JPEG, JPEG 2000 and TIFF (the formats
 * ingest routes to the GPU; anything else in a batch would only fail the whole decode call). */
static inline int ing_nv_routed(const char *name) {
    return strcmp(name, "jpeg") == 0 || strcmp(name, "jpeg2k") == 0 || strcmp(name, "tiff") == 0;
}

/* The functions from ING_NV_COUNT addresses in ING_NV_* order. */
static inline void ing_nv_functions_from(ing_nv_functions *f, void *const *p) {
    f->create = (ing_nv_create_fn)p[ING_NV_CREATE];
    f->info = (ing_nv_info_fn)p[ING_NV_INFO];
    f->sub = (ing_nv_sub_fn)p[ING_NV_SUB];
    f->image = (ing_nv_image_fn)p[ING_NV_IMAGE];
    f->decode = (ing_nv_decode_fn)p[ING_NV_DECODE];
    f->wait = (ing_nv_future_fn)p[ING_NV_WAIT];
    f->status = (ing_nv_status_fn)p[ING_NV_STATUS];
    f->destroy = (ing_nv_future_fn)p[ING_NV_FUTURE_DESTROY];
}

/* Per-image handle slots (reused from batch to batch: nvImageCodec takes an existing handle back) and struct
 * arrays: infos (nvimgcodecImageInfo_t, stride info_stride, filled by the caller), views
 * (nvimgcodecCodeStreamView_t, stride view_stride, region ndim set; region start and end at start_off and
 * end_off), probe (one nvimgcodecCodeStreamInfo_t, its codec name at codec_off). */
typedef struct {
    void **parents, **subs, **images;
    char *infos, *views, *probe;
    ptrdiff_t info_stride, view_stride, start_off, end_off, codec_off;
} ing_nv_slots;

/* Decodes n images (datas[i], lens[i]; regions[4 i ..]: x0 y0 x1 y1, or x1 <= x0 for the whole image) into the
 * buffers their infos name. Scratch: streams and images of n pointers, picked of n, statuses of n. */
static inline int ing_nv_run(const ing_nv_functions *f, void *instance, void *decoder, const void *params,
                             ptrdiff_t n, const unsigned char *const *datas, const size_t *lens,
                             const int32_t *regions, const ing_nv_slots *s, uint32_t *out, void **streams,
                             void **images, ptrdiff_t *picked, uint32_t *statuses) {
    ptrdiff_t m = 0;
    for (ptrdiff_t i = 0; i < n; ++i) {
        int st = f->create(instance, &s->parents[i], datas[i], lens[i], NULL);
        if (st == 0) { /* parse now: one stream no parser takes would fail the whole batch's decode call */
            st = f->info(s->parents[i], s->probe);
            if (st == 0 && !ing_nv_routed(s->probe + s->codec_off)) {
                out[i] = ING_NV_OUT_NOT_JPEG;
                continue;
            }
        }
        void *source = s->parents[i];
        const int32_t *r = regions + 4 * i;
        if (st == 0 && r[2] > r[0]) {
            char *view = s->views + i * s->view_stride;
            int32_t *start = (int32_t *)(view + s->start_off), *end = (int32_t *)(view + s->end_off);
            start[0] = r[1]; start[1] = r[0]; end[0] = r[3]; end[1] = r[2];  /* (y, x) order */
            st = f->sub(s->parents[i], &s->subs[i], view);
            source = s->subs[i];
        }
        if (st == 0) st = f->image(instance, &s->images[i], s->infos + i * s->info_stride);
        if (st != 0) {
            out[i] = ING_NV_OUT_PARSE | (uint32_t)st;
            continue;
        }
        streams[m] = source;
        images[m] = s->images[i];
        picked[m++] = i;
    }
    if (m == 0) return 0;
    void *future = NULL;
    int st = f->decode(decoder, streams, images, (int)m, params, &future);
    for (ptrdiff_t k = 0; k < m; ++k) statuses[k] = 0;
    if (future != NULL) {
        f->wait(future);
        if (st == 0) {
            size_t size = (size_t)m;
            f->status(future, statuses, &size);
        }
        f->destroy(future);
    }
    for (ptrdiff_t k = 0; k < m; ++k) out[picked[k]] = st != 0 ? (ING_NV_OUT_DECODE | (uint32_t)st) : statuses[k];
    return st;
}

#endif
