/* The native engine's parse of one record of each record format (ingest/_native/engine.c's read team), in pure C:
 * no Python object, no allocation, safe on any thread, and callable on its own (dev/fuzz_native.c feeds it
 * hostile bytes under the sanitizers). Each finds the image (and label, and mask where asked) of one record the
 * way its Python reader does, or gives 0 where that reader decides (it reads the record or names its problem).
 */
#ifndef INGEST_RECORD_PARSE_H
#define INGEST_RECORD_PARSE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "crc32c.h"
#include "example_scan.h"

#define RECORDIO_MAGIC 0xCED7230Au
#define FRAMED_IMAGE 1 /* formats/_framed.py's KIND_CODES the engine reads: image, int, mask */
#define FRAMED_INT 3
#define FRAMED_MASK 10
#define FRAMED_MAX 3   /* fields of a framed record the engine parses */
#define LEN_MASK ((1u << 29) - 1)

/* a TFRecord record's CRC check (tfrecord_check; the read team keeps it per sample) */
enum { TF_OK = 0, TF_LENGTH_CRC = 1, TF_DATA_CRC = 2, TF_FRAMING = 3 };

/* A whole TFRecord record's framing and masked CRC32Cs, in the order tfrecord.unframe checks them: TF_FRAMING (too
 * short), TF_LENGTH_CRC, TF_FRAMING (a length that is not the record's), TF_DATA_CRC, else TF_OK. */
static int tfrecord_check(const unsigned char *p, int64_t len) {
    if (len < EX_FRAMING)
        return TF_FRAMING;
    if (ex_mask(ing_crc32c(0, p, 8)) != ex_le32(p + 8))
        return TF_LENGTH_CRC;
    if (ex_le64(p) != (uint64_t)(len - EX_FRAMING))
        return TF_FRAMING;
    if (ex_mask(ing_crc32c(0, p + 12, (size_t)(len - EX_FRAMING))) != ex_le32(p + len - 4))
        return TF_DATA_CRC;
    return TF_OK;
}

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* recordio._class_label: the header's label when it is a whole number in [0, 2**31), else -1 (NaN fails). */
static int64_t class_label(float label) {
    double v = (double)label;
    return v >= 0.0 && v < 2147483648.0 && v == floor(v) ? (int64_t)v : -1;
}

/* The image of an unsplit RecordIO record (magic, lrec with flag 0, IRHeader, `flag` float labels, image), as
 * recordio.unpack reads it; 0 for anything else (split records, damage: the Python reader joins or reports them). */
static int recordio_image(const unsigned char *p, int64_t len, int64_t *start, int64_t *end, int64_t *label) {
    if (len <= 32 || le32(p) != RECORDIO_MAGIC)
        return 0;
    uint32_t lrec = le32(p + 4), flag = le32(p + 8);
    if (lrec > LEN_MASK || lrec < 24 || 8 + (int64_t)lrec > len)
        return 0;
    if (flag > (lrec - 24) / 4)
        return 0;
    int64_t s = 32 + 4 * (int64_t)flag, stop = 8 + (int64_t)lrec;
    if (s >= stop)
        return 0;
    float value;
    uint32_t bits = le32(p + 12);
    memcpy(&value, &bits, sizeof value);
    *start = s;
    *end = stop;
    *label = flag == 0 ? class_label(value) : -1;
    return 1;
}

/* The image (the first `keys` entry, one bytes value), label (the second where the table reads one, one int64; -1
 * without one) and mask (the last where `mask_cell` >= 0, one bytes value: its start and length in mask[0..1]) of a
 * whole framed TFRecord record holding a canonical tf.train.Example (example_scan.h), as TFRecordSource reads them;
 * 0 for anything else (a framing that does not hold, an empty image or mask, a missing key, protobuf's other
 * encodings: the Python reader reads the record or names its problem). CRCs are checked before (tfrecord_check). */
static int tfrecord_image(const unsigned char *p, int64_t len, const ex_request *keys, int mask_cell,
                          int64_t *start, int64_t *end, int64_t *label, int64_t *mask) {
    if (len < EX_FRAMING || ex_le64(p) != (uint64_t)(len - EX_FRAMING))
        return 0;
    int64_t cells[6] = {0, 0, -1, 0, 0, 0}, spare;
    ex_side side = {&spare, 0, 0};
    ex_span data = {p + 12, p + len - 4};
    if (ex_scan_example(data, keys, p, cells, &side) != EX_OK || cells[1] == 0)
        return 0;
    *start = cells[0];
    *end = cells[0] + cells[1];
    *label = keys->m > 1 + (mask_cell >= 0) ? cells[2] : -1;
    if (mask_cell >= 0) {
        mask[0] = cells[2 * mask_cell];
        mask[1] = cells[2 * mask_cell + 1];
        if (mask[1] == 0)
            return 0;
    }
    return 1;
}

/* The image (field 4, data) and label (field 5, int32; -1 where absent) of an encoded Caffe Datum, as LMDBSource
 * reads them (protobuf keeps the last of a repeated scalar); 0 where its protobuf parse decides instead: not a
 * plain sequence of fields, a known field of another wire type, data given twice or empty, encoded false. */
static int datum_image(const unsigned char *p, int64_t len, int64_t *start, int64_t *end, int64_t *label) {
    ex_span s = {p, p + len}, v = {NULL, NULL}, data = {NULL, NULL};
    uint32_t number;
    int wire, encoded = 0, has_data = 0;
    uint64_t x = 0;
    int64_t own = -1;
    while (s.p < s.end) {
        if (ex_next_field(&s, &number, &wire, &v, &x) != EX_OK)
            return 0;
        switch (number) {
        case 1: /* channels, height, width */
        case 2:
        case 3:
            if (wire != 0)
                return 0;
            break;
        case 4:
            if (wire != 2 || has_data)
                return 0;
            has_data = 1;
            data = v;
            break;
        case 5:
            if (wire != 0)
                return 0;
            own = (int64_t)(int32_t)(uint32_t)x;
            break;
        case 6: /* float_data: packed or one value */
            if ((wire != 2 && wire != 5) || (wire == 2 && (v.end - v.p) % 4))
                return 0;
            break;
        case 7:
            if (wire != 0)
                return 0;
            encoded = x != 0;
            break;
        default: /* an unknown field: protobuf keeps it aside */
            break;
        }
    }
    if (!has_data || !encoded || data.end == data.p)
        return 0;
    *start = data.p - p;
    *end = data.end - p;
    *label = own;
    return 1;
}

/* The image, label and (`mask_cell` >= 0: the field there, of kind 10) mask of our LMDB layout's framed record
 * (formats/_framed.py: b"IGR1", then per declared field its kind code, u64 length and payload) whose fields have
 * the kind codes `codes` in order (1 the image, 3 the int label of 8 bytes, 10 a mask; -1 as the label without
 * one), as _framed.decode takes it: each field's code as declared, its length inside the record, nothing after
 * the last; 0 for any other record and an empty mask (Python's decode reads it or names its problem). */
static int framed_image(const unsigned char *p, int64_t len, const unsigned char *codes, int n, int mask_cell,
                        int64_t *start, int64_t *end, int64_t *label, int64_t *mask) {
    if (len < 4 || memcmp(p, "IGR1", 4) != 0)
        return 0;
    int64_t at = 4;
    *label = -1;
    for (int f = 0; f < n; ++f) {
        if (len - at < 9 || p[at] != codes[f])
            return 0;
        uint64_t size = ex_le64(p + at + 1);
        at += 9;
        if (size > (uint64_t)(len - at))
            return 0;
        if (codes[f] == FRAMED_IMAGE) {
            *start = at;
            *end = at + (int64_t)size;
        } else if (codes[f] == FRAMED_INT) {
            if (size != 8)
                return 0;
            *label = (int64_t)ex_le64(p + at);
        } else if (f == mask_cell) {
            if (size == 0)
                return 0;
            mask[0] = at;
            mask[1] = (int64_t)size;
        }
        at += (int64_t)size;
    }
    return at == len;
}

/* -- an Object Detection API record's boxes (engine_det.h's det_record: a "tfrecord" detection table) ------------ */

enum { DET_XYXY = 0, DET_XYWH = 1, DET_CXCYWH = 2 };
#define DET_RKEYS 6       /* a record's box keys: xmin, ymin, xmax, ymax (float lists), height, width (int64s) */
enum { DET_SCAN_OK = 0, DET_SCAN_RECORD = 1, DET_SCAN_BOXES = 2 };

/* What a record's scan asks for: the keys (DET_RKEYS box keys, then one per per-box field, then one per per-sample
 * field) and their codes ("FFFFii", 'I' or 'F' per box field of fsize 8 or 4 bytes, 'i' or 'b' per sample field),
 * the asked box format and the boxes a sample may have. */
typedef struct {
    const ex_request *rq;
    const char *kinds;
    int nfields, nsample, format;
    const int64_t *fsize;
    int64_t most;
} det_spec;

/* x rounded to float32 (through memory: the compiler may not keep the double in a register past the rounding). */
static double det_f32(double x) {
    volatile float f = (float)x;
    return f;
}

/* One box of a record, its normalized coordinates c (float32 values) in pixels of the record's size (w, h), as
 * TFRecordSource gives it (`tfrecord._od_boxes`: float64 products rounded to float32, then `boxes.convert` to the
 * asked format in float64, rounded to float32) and the pipeline takes it back to ltrb (`ops.boxes.to_ltrb`). */
static void det_record_box(int format, const double *c, double w, double h, double *to) {
    double b[4] = {det_f32(c[0] * w), det_f32(c[1] * h), det_f32(c[2] * w), det_f32(c[3] * h)};
    if (format == DET_XYWH) {
        b[2] = det_f32(b[2] - b[0]) + b[0];
        b[3] = det_f32(b[3] - b[1]) + b[1];
    } else if (format == DET_CXCYWH) {
        double bw = b[2] - b[0], bh = b[3] - b[1];
        double cx = det_f32(b[0] + bw / 2), cy = det_f32(b[1] + bh / 2), fw = det_f32(bw), fh = det_f32(bh);
        b[0] = cx - fw / 2;
        b[1] = cy - fh / 2;
        b[2] = fw + b[0];
        b[3] = fh + b[1];
    }
    memcpy(to, b, sizeof b);
}

/* A decimal image id (`tfrecord`'s "od_id": ASCII digits, at least one) that fits an int64; 0 otherwise. */
static int det_decimal(const unsigned char *p, int64_t len, int64_t *value) {
    if (len < 1 || len > 18)
        return 0;
    int64_t v = 0;
    for (int64_t c = 0; c < len; ++c) {
        if (p[c] < '0' || p[c] > '9')
            return 0;
        v = 10 * v + (p[c] - '0');
    }
    *value = v;
    return 1;
}

static double det_side(const int64_t *side, int64_t at) {
    double v;
    memcpy(&v, side + at, sizeof v);
    return v;
}

/* The boxes and fields of one whole framed TFRecord record (p, len bytes; its CRCs checked before) as TFRecordSource
 * reads them: `side` (most * (4 + nfields) + 1 int64s) the scan's scratch, then `count` boxes as ltrb in pixels at
 * `to` (4 doubles each), each per-box field's `count` values at fields[f], each per-sample field's value at
 * values[v]. DET_SCAN_OK; DET_SCAN_RECORD where the scan does not take the record, its lists differ in length from
 * its boxes, its size is not positive or an id is not a decimal int64; DET_SCAN_BOXES where it has more than `most`
 * boxes. */
static int det_scan_record(const det_spec *d, const unsigned char *p, int64_t len, int64_t *side_buf, double *to,
                           unsigned char *const *fields, int64_t *values, int64_t *count_out) {
    int64_t cells[2 * EX_MAX_KEYS];
    if (len < EX_FRAMING)
        return DET_SCAN_RECORD;
    int64_t cap = d->most * (4 + d->nfields) + 1; /* one more than `most` boxes need: a full side says too many */
    ex_side side = {side_buf, cap, 0};
    ex_span data = {p + 12, p + len - 4};
    if (ex_scan_example(data, d->rq, p, cells, &side) != EX_OK)
        return side.used == cap ? DET_SCAN_BOXES : DET_SCAN_RECORD;
    int64_t count = cells[1], h = cells[8], w = cells[10];
    if (cells[3] != count || cells[5] != count || cells[7] != count || h <= 0 || w <= 0)
        return DET_SCAN_RECORD;
    if (count > d->most)
        return DET_SCAN_BOXES;
    for (int f = 0; f < d->nfields; ++f)
        if (cells[2 * (DET_RKEYS + f) + 1] != count)
            return DET_SCAN_RECORD; /* (the pipeline prunes a field with its boxes: Python names the mismatch) */
    for (int v = 0; v < d->nsample; ++v) {
        const int64_t *cell = cells + 2 * (DET_RKEYS + d->nfields + v);
        if (d->kinds[DET_RKEYS + d->nfields + v] == 'b') {
            if (!det_decimal(p + cell[0], cell[1], &values[v]))
                return DET_SCAN_RECORD;
        } else {
            values[v] = cell[0];
        }
    }
    for (int64_t c = 0; c < count; ++c) {
        double in[4];
        for (int q = 0; q < 4; ++q)
            in[q] = det_side(side_buf, cells[2 * q] + c);
        det_record_box(d->format, in, (double)w, (double)h, to + 4 * c);
    }
    for (int f = 0; f < d->nfields; ++f) {
        int64_t at = cells[2 * (DET_RKEYS + f)];
        unsigned char *out = fields[f];
        for (int64_t c = 0; c < count; ++c) {
            if (d->fsize[f] == 8) {
                memcpy(out + 8 * c, side_buf + at + c, 8);
            } else {
                float v = (float)det_side(side_buf, at + c);
                memcpy(out + 4 * c, &v, 4);
            }
        }
    }
    *count_out = count;
    return DET_SCAN_OK;
}

#endif
