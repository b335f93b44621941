/* The native parsers on their own, for tests/test_fuzz_native.py to feed hostile bytes under AddressSanitizer and
 * UndefinedBehaviorSanitizer: the PNG decoder (png_decode.h, image and mask modes), the JPEG header scan
 * (jpeg_scan.h), the tf.train.Example scan (example_scan.h) and the native engine's record parses (record_parse.h:
 * RecordIO, TFRecord, Caffe Datum, framed records, an Object Detection API record's boxes).
 *
 * Input on stdin, a sequence of cases: mode (1 byte), length (uint32, little-endian), that many bytes. Each case's
 * bytes are copied into a buffer of exactly their size, so a read past them is a sanitizer report. Output on
 * stdout, per case: length (uint32) and that many bytes, little-endian int64s unless said otherwise:
 *
 *   'P' / 'M'  a PNG as an image (rgb) / as a mask, at most MAX_PIXELS pixels: header status, status, height,
 *              width, depth, colour type, offset; then the message (128 bytes) and, where decoded, the pixels.
 *   'J'        a JPEG: the 9 columns of ing_jpeg_scan.
 *   'E' / 'O'  a request, then an Example (E) or a whole TFRecord record (O) scanned for it: see read_request.
 *              E: rc, side used, the 2 m cells, the side's values. O: rc, count, the boxes (4 doubles each), the
 *              per-box fields' values (fsize bytes each), the per-sample values.
 *   'R' / 'D'  a RecordIO record / an encoded Caffe Datum: ok, start, end, label.
 *   'T'        a request (kinds "b", "bi", "bb" or "bib"), mask cell (int8), then a whole TFRecord record: CRC check
 *              code, ok, start, end, label, mask start, mask length.
 *   'F'        field count n (1 byte), n kind codes, mask cell (int8), then a framed record: as 'T' without the
 *              CRC check code.
 *
 * Every range a parse reports is checked to lie inside its input; one that does not aborts (a crash the test sees).
 * Build: cc -std=c11 -O1 -g -ffp-contract=off -fsanitize=address,undefined -fno-sanitize-recover=all
 *        -I ingest/_native tests/fuzz_native.c -ldl -lm
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "example_scan.h"
#include "jpeg_scan.h"
#include "png_decode.h"
#include "record_parse.h"

#define MAX_PIXELS ((int64_t)1 << 22)

static uint8_t *out_buf;
static size_t out_len, out_cap;

static void put(const void *p, size_t n) {
    if (out_len + n > out_cap) {
        out_cap = (out_len + n) * 2;
        out_buf = realloc(out_buf, out_cap);
        if (out_buf == NULL)
            abort();
    }
    memcpy(out_buf + out_len, p, n);
    out_len += n;
}

static void put64(int64_t v) { put(&v, 8); }

static void flush_case(void) {
    uint32_t n = (uint32_t)out_len;
    fwrite(&n, 4, 1, stdout);
    fwrite(out_buf, 1, out_len, stdout);
    out_len = 0;
}

static void inside(int64_t start, int64_t length, int64_t total, const char *what) {
    if (start < 0 || length < 0 || start > total || length > total - start) {
        fprintf(stderr, "INVARIANT: %s [%lld, +%lld) outside %lld bytes\n", what, (long long)start, (long long)length,
                (long long)total);
        abort();
    }
}

/* A cursor over one case's bytes; a short read gives zeros and marks it spent. */
typedef struct {
    const uint8_t *p;
    size_t left;
} cursor;

static int take(cursor *c, void *to, size_t n) {
    if (c->left < n) {
        memset(to, 0, n);
        c->left = 0;
        return 0;
    }
    memcpy(to, c->p, n);
    c->p += n;
    c->left -= n;
    return 1;
}

/* A request: m (1 byte, at most EX_MAX_KEYS), then per key its kind code (1 byte), length (1 byte) and bytes; then
 * (O only) nfields, nsample, format (1 byte each), most (uint16) and each field's size (1 byte: 4 or 8). */
typedef struct {
    ex_request rq;
    char kinds[EX_MAX_KEYS + 1];
    char keys[EX_MAX_KEYS][256];
} request;

static int read_request(cursor *c, request *r) {
    uint8_t m;
    if (!take(c, &m, 1) || m > EX_MAX_KEYS)
        return 0;
    r->rq.m = m;
    for (int k = 0; k < m; ++k) {
        uint8_t kind, len;
        if (!take(c, &kind, 1) || !take(c, &len, 1) || !take(c, r->keys[k], len))
            return 0;
        r->kinds[k] = (char)kind;
        r->rq.keys[k] = r->keys[k];
        r->rq.lens[k] = len;
    }
    r->kinds[m] = 0;
    r->rq.kinds = r->kinds;
    return 1;
}

/* The case's remaining bytes in a buffer of exactly their size (a malloc of 1 for none). */
static uint8_t *exact(const cursor *c) {
    uint8_t *b = malloc(c->left ? c->left : 1);
    if (b == NULL)
        abort();
    memcpy(b, c->p, c->left);
    return b;
}

static void run_png(cursor *c, int rgb, ing_png_worker *wk) {
    uint8_t *data = exact(c);
    ing_png png = {.data = data, .len = c->left, .rgb = rgb, .offset = -1};
    int header = ing_png_header(&png);
    uint8_t *pixels = NULL;
    size_t bytes = 0;
    if (header == ING_PNG_DECODED) {
        if ((int64_t)png.width * png.height > MAX_PIXELS) {
            png.status = -1; /* (the callers refuse these before allocating: max_pixels) */
        } else {
            bytes = (size_t)png.width * png.height * ing_png_itemsize(&png);
            pixels = malloc(bytes);
            if (pixels == NULL)
                abort();
            memset(pixels, 0xA5, bytes);
            png.out = pixels;
            ing_png_decode(&png, wk);
        }
    }
    int64_t head[7] = {header, png.status, png.height, png.width, png.depth, png.ctype, png.offset};
    put(head, sizeof head);
    put(png.message, sizeof png.message);
    if (png.status == ING_PNG_DECODED && pixels != NULL)
        put(pixels, bytes);
    free(pixels);
    free(data);
}

static void run_example(cursor *c) {
    request r;
    if (!read_request(c, &r)) {
        put64(-1);
        return;
    }
    uint16_t cap;
    take(c, &cap, 2);
    uint8_t *data = exact(c);
    int64_t *side = malloc(((size_t)cap + 1) * 8), cells[2 * EX_MAX_KEYS];
    for (int k = 0; k < 2 * EX_MAX_KEYS; ++k)
        cells[k] = -7;
    ex_side sb = {side, cap, 0};
    ex_span s = {data, data + c->left};
    int rc = ex_scan_example(s, &r.rq, data, cells, &sb);
    if (sb.used < 0 || sb.used > cap)
        abort();
    put64(rc);
    put64(sb.used);
    if (rc == EX_OK) {
        for (int k = 0; k < r.rq.m; ++k) {
            char kind = r.kinds[k];
            if (kind == 'b')
                inside(cells[2 * k], cells[2 * k + 1], (int64_t)c->left, "a bytes value");
            else if (kind == 'I' || kind == 'F')
                inside(cells[2 * k], cells[2 * k + 1], sb.used, "a list in the side buffer");
        }
    }
    put(cells, 2 * (size_t)r.rq.m * 8);
    put(side, (size_t)sb.used * 8);
    free(side);
    free(data);
}

static void run_detection(cursor *c) {
    request r;
    uint8_t nfields, nsample, format, sizes[EX_MAX_KEYS];
    uint16_t most;
    if (!read_request(c, &r) || !take(c, &nfields, 1) || !take(c, &nsample, 1) || !take(c, &format, 1) ||
        !take(c, &most, 2) || !take(c, sizes, nfields) || r.rq.m != DET_RKEYS + nfields + nsample || most < 1 ||
        format > DET_CXCYWH || memcmp(r.kinds, "FFFFii", DET_RKEYS) != 0) {
        put64(-1);
        return;
    }
    int64_t fsize[EX_MAX_KEYS];
    for (int f = 0; f < nfields; ++f) {
        fsize[f] = sizes[f] == 8 ? 8 : 4;
        if (r.kinds[DET_RKEYS + f] != (fsize[f] == 8 ? 'I' : 'F')) {
            put64(-1);
            return;
        }
    }
    for (int v = 0; v < nsample; ++v)
        if (r.kinds[DET_RKEYS + nfields + v] != 'i' && r.kinds[DET_RKEYS + nfields + v] != 'b') {
            put64(-1);
            return;
        }
    det_spec spec = {&r.rq, r.kinds, nfields, nsample, format, fsize, most};
    uint8_t *data = exact(c);
    /* each buffer exactly as big as engine.c's set_detection makes it per sample */
    int64_t *side = malloc((size_t)(most * (4 + nfields) + 1) * 8);
    double *boxes = malloc((size_t)most * 4 * sizeof(double));
    unsigned char *fields[EX_MAX_KEYS];
    for (int f = 0; f < nfields; ++f)
        fields[f] = malloc((size_t)(most * fsize[f]));
    int64_t values[EX_MAX_KEYS], count = -1;
    int rc = det_scan_record(&spec, data, (int64_t)c->left, side, boxes, fields, values, &count);
    put64(rc);
    put64(rc == DET_SCAN_OK ? count : -1);
    if (rc == DET_SCAN_OK) {
        if (count < 0 || count > most)
            abort();
        put(boxes, (size_t)count * 4 * sizeof(double));
        for (int f = 0; f < nfields; ++f)
            put(fields[f], (size_t)(count * fsize[f]));
        put(values, (size_t)nsample * 8);
    }
    for (int f = 0; f < nfields; ++f)
        free(fields[f]);
    free(boxes);
    free(side);
    free(data);
}

static void run_range(int ok, int64_t start, int64_t end, int64_t label, const int64_t *mask, int64_t len) {
    put64(ok);
    put64(ok ? start : 0);
    put64(ok ? end : 0);
    put64(ok ? label : 0);
    put64(ok && mask ? mask[0] : 0);
    put64(ok && mask ? mask[1] : 0);
    if (ok) {
        inside(start, end - start, len, "an image");
        if (mask != NULL && mask[1] >= 0)
            inside(mask[0], mask[1], len, "a mask");
    }
}

static void run_record(int mode, cursor *c) {
    int64_t start = 0, end = 0, label = 0, mask[2] = {0, -1};
    if (mode == 'R' || mode == 'D') {
        uint8_t *data = exact(c);
        int64_t len = (int64_t)c->left;
        int ok = mode == 'R' ? recordio_image(data, len, &start, &end, &label)
                             : datum_image(data, len, &start, &end, &label);
        run_range(ok, start, end, label, NULL, len);
        free(data);
        return;
    }
    int8_t cell;
    if (mode == 'T') {
        request r;
        if (!read_request(c, &r) || !take(c, &cell, 1) || r.rq.m < 1 || cell >= r.rq.m) {
            put64(-1);
            return;
        }
        uint8_t *data = exact(c);
        int64_t len = (int64_t)c->left;
        put64(tfrecord_check(data, len));
        int ok = tfrecord_image(data, len, &r.rq, cell < 0 ? -1 : cell, &start, &end, &label, mask);
        run_range(ok, start, end, label, cell >= 0 ? mask : NULL, len);
        free(data);
        return;
    }
    uint8_t n, codes[FRAMED_MAX];
    if (!take(c, &n, 1) || n > FRAMED_MAX || !take(c, codes, n) || !take(c, &cell, 1) || cell >= n) {
        put64(-1);
        return;
    }
    uint8_t *data = exact(c);
    int64_t len = (int64_t)c->left;
    int ok = framed_image(data, len, codes, n, cell < 0 ? -1 : cell, &start, &end, &label, mask);
    run_range(ok, start, end, label, cell >= 0 ? mask : NULL, len);
    free(data);
}

int main(void) {
    const char *why = ing_png_load();
    if (why != NULL) {
        fprintf(stderr, "%s\n", why);
        return 2;
    }
    ing_crc32c_init();
    ing_png_worker wk = {0};
    for (;;) {
        uint8_t mode;
        uint32_t len;
        if (fread(&mode, 1, 1, stdin) != 1)
            break;
        if (fread(&len, 4, 1, stdin) != 1)
            return 2;
        uint8_t *bytes = malloc(len ? len : 1);
        if (bytes == NULL || fread(bytes, 1, len, stdin) != len)
            return 2;
        cursor c = {bytes, len};
        switch (mode) {
        case 'P':
        case 'M':
            run_png(&c, mode == 'P', &wk);
            break;
        case 'J': {
            uint8_t *data = exact(&c);
            int64_t row[ING_JPEG_COLUMNS];
            ing_jpeg_scan(data, (ptrdiff_t)len, row);
            put(row, sizeof row);
            free(data);
            break;
        }
        case 'E':
            run_example(&c);
            break;
        case 'O':
            run_detection(&c);
            break;
        default:
            run_record(mode, &c);
            break;
        }
        flush_case();
        free(bytes);
    }
    ing_png_worker_free(&wk);
    fflush(stdout);
    return 0;
}
