/* PNGs decoded in pure C on any thread (no Python object, no GIL): the core that ingest/decode/_png.c (a batch for
 * ingest.decode.masks) and ingest/_native/engine.c (the native engine's mask field and its PNG images) share. As a
 * mask (the default) it decodes the PNGs a mask usually is (non-interlaced, one stored band) to exactly what
 * Pillow's `np.array(img)` gives for them, and says which ones it leaves to Pillow:
 *
 *   colour type, bit depth        decoded to
 *   3 (palette) 1, 2, 4, 8        the indices, uint8
 *   0 (gray) 1                    0 and 1, uint8 (Pillow's mode "1", as decode_mask gives it)
 *   0 (gray) 8                    the levels, uint8
 *   0 (gray) 16                   the values, uint16 in the machine's byte order
 *   4 (gray + alpha) 8            the gray band, uint8
 *
 * Left to Pillow (status ING_PNG_PILLOW): no PNG signature; Adam7 interlacing; gray at 2 or 4 bits (Pillow scales
 * the levels); colour types 2 and 6 and 16-bit gray + alpha (Pillow makes them RGB/RGBA, which masks.py refuses);
 * animated PNGs (acTL/fcTL/fdAT); an unknown critical chunk; a palette image without PLTE or with a PLTE of more
 * than 256 entries (Pillow refuses that palette); a gray tRNS shorter than 2 bytes; data that ends at a chunk
 * boundary without IEND; an ancillary chunk Pillow refuses the file for
 * (png_pillow_raises: a gAMA, cHRM, sRGB or pHYs too short for its fields, an iCCP or zTXt of an unknown
 * compression method, an iCCP, zTXt or iTXt inflating past 1 MiB, text chunks past 64 MiB), so that what Pillow
 * refuses is never decoded here. Everything else is decoded or refused (ING_PNG_REFUSED) with a message and the
 * byte offset it concerns.
 *
 * As an image (`rgb` set before the header is read) it decodes every 8-bit or lower, non-interlaced PNG to uint8
 * [H, W, 3] RGB, exactly what ingest.decode.cpu gives (Pillow's `convert("RGB")` with the transparency dropped):
 * RGB as stored and RGBA without its alpha (colour types 2 and 6, 8-bit); palette indices (1, 2, 4, 8 bits) looked
 * up in PLTE; gray (1, 2, 4, 8 bits) scaled to 0..255 as Pillow unpacks it (v * 255 / (2^bits - 1)) and gray +
 * alpha's gray band, each in all three channels. Left to Pillow: 16 bits; Adam7; an eXIf chunk (an orientation
 * the CPU decoder applies); a palette image's PLTE that is not 1..256 whole entries or comes after IDAT; an index
 * past the palette's entries (found while decoding: status ING_PNG_PILLOW then); a colour tRNS shorter than 6 bytes;
 * and the mask's cases that concern any PNG (no signature, animation, an unknown critical chunk, no PLTE, a short
 * gray tRNS, no IEND). Other ancillary chunks are skipped, as for masks.
 *
 * What is checked (the PNG specification, W3C / RFC 2083): the signature; IHDR first, 13 bytes, its width and
 * height 1..2^31-1, its bit depth allowed for its colour type, compression and filter method 0, interlace 0 or
 * 1; every chunk's length (at most 2^31-1, inside the data), type (four ASCII letters) and CRC, IDAT's
 * included; one IHDR; IDATs consecutive; at least one IDAT; the filter type of each row (0-4); the zlib stream
 * (zlib checks its Adler-32) inflating to exactly height * (1 + row bytes) bytes and then ending. The inflater
 * works a block of rows at a time, so memory stays the output plus 64 KiB (or two rows) whatever the compressed
 * stream claims.
 *
 * zlib is loaded at run time (ing_png_load: dlopen libz.so.1), so this builds with no header but the C library's.
 *
 * Use: ing_png p = {.data, .len} (.rgb = 1 for an image); ing_png_header(&p) (signature and IHDR: width, height,
 * depth, colour type; no allocation), then, where it gives ING_PNG_DECODED, point p.out at height * width *
 * ing_png_itemsize(&p) bytes and ing_png_decode(&p, &worker) (the chunks walked and checked, the rows inflated); p.status says how it went.
 * An ing_png_worker (zeroed to start) keeps an inflater and row scratch from one image to the next on one thread;
 * ing_png_worker_free releases them.
 */
#ifndef INGEST_PNG_DECODE_H
#define INGEST_PNG_DECODE_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlsyms.h"

/* -- zlib, loaded at run time ------------------------------------------------------------------------------ */

/* zlib.h's z_stream (uInt = unsigned int, uLong = unsigned long); inflateInit_ checks the size we pass. */
typedef struct {
    const unsigned char *next_in;
    unsigned int avail_in;
    unsigned long total_in;
    unsigned char *next_out;
    unsigned int avail_out;
    unsigned long total_out;
    const char *msg;
    void *state;
    void *zalloc, *zfree, *opaque; /* NULL: zlib's malloc and free */
    int data_type;
    unsigned long adler, reserved;
} ing_z_stream;

#define ING_Z_OK 0
#define ING_Z_STREAM_END 1
#define ING_Z_NEED_DICT 2
#define ING_Z_BUF_ERROR (-5)
#define ING_Z_NO_FLUSH 0

static struct {
    void *lib;
    const char *(*version)(void);
    int (*init)(ing_z_stream *, const char *, int);
    int (*inflate)(ing_z_stream *, int);
    int (*reset)(ing_z_stream *);
    int (*end)(ing_z_stream *);
    unsigned long (*crc32)(unsigned long, const unsigned char *, unsigned int);
} ing_z;

/* Loads zlib once (called with the GIL held, or before any thread decodes); NULL or a message. */
static const char *ing_png_load(void) {
    if (ing_z.lib != NULL)
        return NULL;
    const ing_symbol names[] = {
        {"zlibVersion", (void **)&ing_z.version}, {"inflateInit_", (void **)&ing_z.init},
        {"inflate", (void **)&ing_z.inflate},     {"inflateReset", (void **)&ing_z.reset},
        {"inflateEnd", (void **)&ing_z.end},      {"crc32", (void **)&ing_z.crc32},
    };
    int missing;
    void *lib = ing_dlopen_all("libz.so.1", names, sizeof names / sizeof names[0], &missing);
    if (lib == NULL)
        return missing ? "libz.so.1 lacks a function the PNG decoder calls" : "cannot load libz.so.1";
    ing_z.lib = lib;
    return NULL;
}

/* -- one image ---------------------------------------------------------------------------------------------- */

enum { ING_PNG_DECODED, ING_PNG_PILLOW, ING_PNG_REFUSED };

typedef struct {
    const uint8_t *data;
    size_t len;
    int rgb;            /* set by the caller: decode as an RGB image, not as a mask */
    uint32_t width, height;
    int depth, ctype;
    const uint8_t *palette; /* rgb, palette images: PLTE's entries (found by the walk), `entries` of 3 bytes */
    int entries;
    uint8_t *out;       /* height * width * itemsize bytes */
    int status;
    long long offset;   /* of what the message is about; -1: none */
    char message[128];
} ing_png;

/* Rows are inflated this many bytes at a time (or one row, where a row is longer): zlib's fast inflate loop runs
 * only while it has 258 bytes of output room, so a row at a time would spend much of each row in its slow one. */
#define PNG_BLOCK ((size_t)65536)

/* What each worker thread keeps from one image to the next. */
typedef struct {
    ing_z_stream zs;
    int zs_ready;
    uint8_t *rows;   /* the row above, then a block of rows, each with its filter byte */
    size_t rows_size;
} ing_png_worker;

static const uint8_t PNG_SIGNATURE[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};

static uint32_t png_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int png_refuse(ing_png *j, long long offset, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(j->message, sizeof j->message, fmt, args);
    va_end(args);
    j->status = ING_PNG_REFUSED;
    j->offset = offset;
    return ING_PNG_REFUSED;
}

static int png_is_type(const uint8_t *type, const char *name) { return memcmp(type, name, 4) == 0; }

static int png_letters(const uint8_t *type) {
    for (int k = 0; k < 4; ++k)
        if (!((type[k] >= 'A' && type[k] <= 'Z') || (type[k] >= 'a' && type[k] <= 'z')))
            return 0;
    return 1;
}

/* The chunk at `pos` checked: inside the data, a lettered type, its CRC; its data length in *length. */
static int png_chunk(ing_png *j, size_t pos, uint32_t *length) {
    const uint8_t *d = j->data;
    if (j->len - pos < 12)
        return png_refuse(j, (long long)pos, "PNG data ends inside a chunk header (%zu bytes; no IEND)", j->len);
    *length = png_be32(d + pos);
    if (*length > 0x7FFFFFFFu)
        return png_refuse(j, (long long)pos, "PNG chunk length %u exceeds 2^31-1", *length);
    if (!png_letters(d + pos + 4))
        return png_refuse(j, (long long)pos, "PNG chunk type is not four ASCII letters");
    if (j->len - pos - 12 < *length)
        return png_refuse(j, (long long)pos, "PNG chunk '%.4s' of %u bytes runs past the end of the data (%zu bytes)",
                      (const char *)d + pos + 4, *length, j->len);
    if (ing_z.crc32(0, d + pos + 4, *length + 4) != png_be32(d + pos + 8 + *length))
        return png_refuse(j, (long long)pos, "PNG chunk '%.4s' fails its CRC check", (const char *)d + pos + 4);
    return ING_PNG_DECODED;
}

/* Signature and IHDR (no allocation). ING_PNG_PILLOW, ING_PNG_REFUSED, or ING_PNG_DECODED for one to decode. */
static int ing_png_header(ing_png *j) {
    const uint8_t *d = j->data;
    if (j->len < 8 || memcmp(d, PNG_SIGNATURE, 8) != 0)
        return j->status = ING_PNG_PILLOW;
    uint32_t length;
    if (png_chunk(j, 8, &length) != ING_PNG_DECODED)
        return ING_PNG_REFUSED;
    if (!png_is_type(d + 12, "IHDR") || length != 13)
        return png_refuse(j, 8, "PNG does not start with a 13-byte IHDR chunk");
    uint32_t w = png_be32(d + 16), h = png_be32(d + 20);
    int depth = d[24], ctype = d[25], interlace = d[28];
    if (w == 0 || h == 0 || w > 0x7FFFFFFFu || h > 0x7FFFFFFFu)
        return png_refuse(j, 16, "PNG IHDR: width and height must be 1..2^31-1, got %ux%u", w, h);
    int allowed;
    switch (ctype) {
    case 0: allowed = depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16; break;
    case 3: allowed = depth == 1 || depth == 2 || depth == 4 || depth == 8; break;
    case 2: case 4: case 6: allowed = depth == 8 || depth == 16; break;
    default: return png_refuse(j, 25, "PNG IHDR: colour type %d is not 0, 2, 3, 4 or 6", ctype);
    }
    if (!allowed)
        return png_refuse(j, 24, "PNG IHDR: bit depth %d is not allowed for colour type %d", depth, ctype);
    if (d[26] != 0 || d[27] != 0)
        return png_refuse(j, 26, "PNG IHDR: compression method %d and filter method %d must be 0", d[26], d[27]);
    if (interlace > 1)
        return png_refuse(j, 28, "PNG IHDR: interlace method %d is not 0 or 1", interlace);
    int native = interlace == 0 && (j->rgb ? depth != 16 : ctype == 3 || (ctype == 0 && depth != 2 && depth != 4) ||
                                                           (ctype == 4 && depth == 8));
    if (!native)
        return j->status = ING_PNG_PILLOW;
    j->width = w;
    j->height = h;
    j->depth = depth;
    j->ctype = ctype;
    return j->status = ING_PNG_DECODED;
}

/* The output's bytes per pixel: 3 for an image (rgb), else per value: 2 for 16-bit gray, 1 otherwise. */
static inline size_t ing_png_itemsize(const ing_png *j) { return j->rgb ? 3 : j->depth == 16 ? 2 : 1; }

static uint8_t png_paeth(int a, int b, int c) {
    int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    return (uint8_t)(pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
}

/* Undoes the filter of `cur` (its filter byte first) against the row above, `prev`; -1 for an unknown type. */
static int png_unfilter(uint8_t *cur, const uint8_t *prev, size_t n, size_t bpp) {
    uint8_t *x = cur + 1;
    const uint8_t *b = prev + 1;
    size_t i;
    switch (cur[0]) {
    case 0:
        return 0;
    case 1:
        for (i = bpp; i < n; ++i)
            x[i] = (uint8_t)(x[i] + x[i - bpp]);
        return 0;
    case 2:
        for (i = 0; i < n; ++i)
            x[i] = (uint8_t)(x[i] + b[i]);
        return 0;
    case 3:
        for (i = 0; i < bpp && i < n; ++i)
            x[i] = (uint8_t)(x[i] + (b[i] >> 1));
        for (; i < n; ++i)
            x[i] = (uint8_t)(x[i] + ((x[i - bpp] + b[i]) >> 1));
        return 0;
    case 4:
        for (i = 0; i < bpp && i < n; ++i)
            x[i] = (uint8_t)(x[i] + b[i]);
        for (; i < n; ++i)
            x[i] = (uint8_t)(x[i] + png_paeth(x[i - bpp], b[i], b[i - bpp]));
        return 0;
    default:
        return -1;
    }
}

/* One unfiltered row (no filter byte) to its output row. */
static void png_store(const ing_png *j, const uint8_t *x, uint8_t *o) {
    uint32_t w = j->width;
    if (j->depth == 8 && j->ctype != 4) {
        memcpy(o, x, w);
    } else if (j->depth == 16) {
        uint16_t *o16 = (uint16_t *)o;
        for (uint32_t i = 0; i < w; ++i)
            o16[i] = (uint16_t)(x[2 * (size_t)i] << 8 | x[2 * (size_t)i + 1]);
    } else if (j->ctype == 4) {
        for (uint32_t i = 0; i < w; ++i)
            o[i] = x[2 * (size_t)i];
    } else { /* 1, 2 or 4 bits, most significant first: palette indices, or gray 1-bit as 0/1 */
        int depth = j->depth, mask = (1 << depth) - 1;
        for (uint32_t i = 0; i < w; ++i) {
            size_t bit = (size_t)i * depth;
            o[i] = (uint8_t)((x[bit >> 3] >> (8 - depth - (bit & 7))) & mask);
        }
    }
}

/* One unfiltered row (no filter byte) to its RGB output row (rgb); -1 where a palette index is past PLTE's entries. */
static int png_store_rgb(const ing_png *j, const uint8_t *x, uint8_t *o) {
    uint32_t w = j->width;
    int depth = j->depth, mask = (1 << depth) - 1, scale = 255 / mask;
    switch (j->ctype) {
    case 2:
        memcpy(o, x, 3 * (size_t)w);
        return 0;
    case 6:
        for (uint32_t i = 0; i < w; ++i, o += 3, x += 4)
            o[0] = x[0], o[1] = x[1], o[2] = x[2];
        return 0;
    case 4:
        for (uint32_t i = 0; i < w; ++i, o += 3, x += 2)
            o[0] = o[1] = o[2] = x[0];
        return 0;
    default: /* gray or palette, 1, 2, 4 or 8 bits, most significant first */
        for (uint32_t i = 0; i < w; ++i, o += 3) {
            size_t bit = (size_t)i * depth;
            int v = (x[bit >> 3] >> (8 - depth - (bit & 7))) & mask;
            if (j->ctype == 0) {
                o[0] = o[1] = o[2] = (uint8_t)(v * scale);
            } else {
                if (v >= j->entries)
                    return -1;
                memcpy(o, j->palette + 3 * v, 3);
            }
        }
        return 0;
    }
}

/* Feeds the next IDAT's data to the inflater; 0 where the chunk after `*at` is not an IDAT (the chunks were
 * checked by the walk, up to IEND). */
static int png_next_idat(const ing_png *j, ing_z_stream *zs, size_t *at) {
    for (;;) {
        size_t pos = *at + 12 + png_be32(j->data + *at);
        if (j->len - pos < 12 || !png_is_type(j->data + pos + 4, "IDAT"))
            return 0;
        *at = pos;
        zs->next_in = j->data + pos + 8;
        zs->avail_in = png_be32(j->data + pos);
        if (zs->avail_in > 0)
            return 1;
    }
}

static const char *png_zmessage(const ing_z_stream *zs, int rc) {
    return zs->msg != NULL ? zs->msg : rc == ING_Z_NEED_DICT ? "a preset dictionary, which PNG does not allow"
                                                         : "zlib error";
}

/* Pillow's PngImagePlugin inflates an iCCP, zTXt or compressed iTXt chunk's data to at most MAX_TEXT_CHUNK (1 MiB)
 * bytes and raises where more would come, and raises once the text chunks hold more than MAX_TEXT_MEMORY (64 MiB). */
#define PNG_PILLOW_TEXT_CHUNK ((size_t)1 << 20)
#define PNG_PILLOW_TEXT_MEMORY ((size_t)64 << 20)

/* The bytes [p, p + n) inflate to, counted up to `limit` (limit where as many or more would come; what inflates
 * before a zlib error where the stream is damaged: Pillow then takes the chunk as empty). The worker's inflater,
 * which png_inflate resets before the pixels. */
static size_t png_inflated(ing_png_worker *wk, const uint8_t *p, size_t n, size_t limit) {
    ing_z_stream *zs = &wk->zs;
    int rc = wk->zs_ready ? ing_z.reset(zs) : ing_z.init(zs, ing_z.version(), (int)sizeof(ing_z_stream));
    if (rc != ING_Z_OK)
        return limit; /* (no inflater: Pillow decides) */
    wk->zs_ready = 1;
    uint8_t scratch[16384];
    size_t total = 0;
    zs->next_in = p;
    zs->avail_in = n < 0x7FFFFFFFu ? (unsigned int)n : 0x7FFFFFFFu;
    do {
        zs->next_out = scratch;
        zs->avail_out = sizeof scratch;
        rc = ing_z.inflate(zs, ING_Z_NO_FLUSH);
        total += sizeof scratch - zs->avail_out;
    } while (rc == ING_Z_OK && total < limit && zs->avail_out == 0);
    return total < limit ? total : limit;
}

/* Whether Pillow's handler of this ancillary chunk (`type`, `length` bytes at `d`) raises, so that Pillow refuses
 * the whole PNG: a gAMA, cHRM, sRGB or pHYs shorter than its fields; an iCCP without a compression method byte,
 * or of another method than 0, or that inflates past 1 MiB; a zTXt of a compression method other than 0, or
 * that inflates past 1 MiB; a compressed iTXt that inflates past 1 MiB. The text chunks' size (tEXt and iTXt as
 * stored, zTXt and a compressed iTXt inflated: at least what Pillow counts) is added to *text. */
static int png_pillow_raises(ing_png_worker *wk, const uint8_t *type, const uint8_t *d, uint32_t length,
                             size_t *text) {
    if (png_is_type(type, "gAMA"))
        return length < 4;
    if (png_is_type(type, "cHRM"))
        return length < 32;
    if (png_is_type(type, "sRGB"))
        return length < 1;
    if (png_is_type(type, "pHYs"))
        return length < 9;
    if (png_is_type(type, "tEXt")) {
        *text += length;
        return 0;
    }
    const uint8_t *nul = memchr(d, 0, length), *end = d + length;
    if (png_is_type(type, "iCCP")) { /* name, NUL, method, data (no NUL: the method is the first byte) */
        const uint8_t *method = nul ? nul + 1 : d;
        return method >= end || *method != 0 || png_inflated(wk, method + 1, (size_t)(end - method - 1),
                                                             PNG_PILLOW_TEXT_CHUNK) >= PNG_PILLOW_TEXT_CHUNK;
    }
    if (png_is_type(type, "zTXt")) { /* keyword, NUL, method, data */
        if (nul == NULL || nul + 1 >= end)
            return 0;
        if (nul[1] != 0)
            return 1;
        size_t got = png_inflated(wk, nul + 2, (size_t)(end - nul - 2), PNG_PILLOW_TEXT_CHUNK);
        *text += got;
        return got >= PNG_PILLOW_TEXT_CHUNK;
    }
    if (png_is_type(type, "iTXt")) { /* keyword, NUL, flag, method, language, NUL, keyword, NUL, text */
        *text += length;
        if (nul == NULL || end - nul < 3 || nul[1] == 0 || nul[2] != 0)
            return 0;
        const uint8_t *lang = memchr(nul + 3, 0, (size_t)(end - nul - 3));
        const uint8_t *word = lang ? memchr(lang + 1, 0, (size_t)(end - lang - 1)) : NULL;
        if (word == NULL)
            return 0;
        size_t got = png_inflated(wk, word + 1, (size_t)(end - word - 1), PNG_PILLOW_TEXT_CHUNK);
        *text += got;
        return got >= PNG_PILLOW_TEXT_CHUNK;
    }
    return 0;
}

/* The chunks after IHDR up to IEND, each checked; ING_PNG_DECODED (to go on) with the first IDAT's offset in *first_idat,
 * or ING_PNG_PILLOW or ING_PNG_REFUSED. */
static int png_walk(ing_png *j, ing_png_worker *wk, size_t *first_idat) {
    size_t pos = 33, text = 0;
    int idats = 0, plte = 0, after_idat = 0;
    for (;;) {
        uint32_t length;
        if (pos == j->len && idats > 0) /* no IEND: Pillow reads such files as far as their data goes */
            return j->status = ING_PNG_PILLOW;
        if (png_chunk(j, pos, &length) != ING_PNG_DECODED)
            return ING_PNG_REFUSED;
        const uint8_t *type = j->data + pos + 4;
        if (png_is_type(type, "IDAT")) {
            if (after_idat)
                return png_refuse(j, (long long)pos, "PNG IDAT chunks are not consecutive");
            if (idats++ == 0)
                *first_idat = pos;
        } else {
            after_idat = idats > 0;
            if (png_is_type(type, "IEND"))
                break;
            if (png_is_type(type, "IHDR"))
                return png_refuse(j, (long long)pos, "PNG has a second IHDR chunk");
            if (png_is_type(type, "PLTE")) {
                plte = 1;
                j->palette = j->data + pos + 8;
                j->entries = (int)(length / 3);
                if (j->ctype == 3 && (length / 3 > 256 || (j->rgb && (length % 3 != 0 || length == 0 || idats > 0))))
                    return j->status = ING_PNG_PILLOW; /* (more than 256 entries: Pillow refuses the palette; an
                                                          image's: part entries, none, or after the pixels) */
            } else if (png_is_type(type, "acTL") || png_is_type(type, "fcTL") || png_is_type(type, "fdAT") ||
                       (png_is_type(type, "tRNS") && j->ctype == 0 && length < 2) || !(type[0] & 0x20) ||
                       (j->rgb && ((png_is_type(type, "tRNS") && j->ctype == 2 && length < 6) ||
                                   png_is_type(type, "eXIf")))) {
                /* animation, a short gray or colour tRNS, an unknown critical chunk, an image's orientation */
                return j->status = ING_PNG_PILLOW;
            } else if (png_pillow_raises(wk, type, j->data + pos + 8, length, &text) ||
                       text > PNG_PILLOW_TEXT_MEMORY) {
                return j->status = ING_PNG_PILLOW; /* Pillow refuses the file: its error names the chunk */
            }
        }
        pos += 12 + (size_t)length;
    }
    if (idats == 0)
        return png_refuse(j, (long long)pos, "PNG has no IDAT chunk");
    if (j->ctype == 3 && !plte)
        return j->status = ING_PNG_PILLOW;
    return ING_PNG_DECODED;
}

/* The IDATs' zlib stream inflated a block of rows at a time, each row unfiltered and stored (without the GIL). */
static void png_inflate(ing_png *j, ing_png_worker *wk, size_t at) {
    static const int CHANNELS[7] = {1, 0, 3, 1, 2, 0, 4}; /* by colour type */
    int channels = CHANNELS[j->ctype];
    size_t bpp = (size_t)(channels * j->depth + 7) / 8;
    size_t row = ((size_t)j->width * channels * j->depth + 7) / 8 + 1; /* with its filter byte */
    size_t stride = (size_t)j->width * ing_png_itemsize(j);
    size_t block = row < PNG_BLOCK ? PNG_BLOCK / row : 1; /* rows inflated per call */
    if (block > j->height)
        block = j->height;
    if (wk->rows_size < (block + 1) * row) {
        free(wk->rows);
        wk->rows_size = (block + 1) * row;
        wk->rows = malloc(wk->rows_size);
        if (wk->rows == NULL) {
            wk->rows_size = 0;
            png_refuse(j, -1, "out of memory for %zu rows of %zu bytes", block + 1, row);
            return;
        }
    }
    ing_z_stream *zs = &wk->zs;
    int rc = wk->zs_ready ? ing_z.reset(zs) : ing_z.init(zs, ing_z.version(), (int)sizeof(ing_z_stream));
    if (rc != ING_Z_OK) {
        png_refuse(j, -1, "zlib cannot start an inflater (%d)", rc);
        return;
    }
    wk->zs_ready = 1;
    uint8_t *prev = wk->rows, *rows = wk->rows + row;
    memset(prev, 0, row);
    zs->next_in = j->data + at + 8;
    zs->avail_in = png_be32(j->data + at);
    int ended = 0;
    for (uint32_t y0 = 0; y0 < j->height; y0 += (uint32_t)block) {
        size_t n = j->height - y0 < block ? j->height - y0 : block, want = n * row, got = 0;
        while (got < want) {
            if (ended) {
                png_refuse(j, (long long)at, "PNG image data ends in row %zu of %u (its zlib stream is complete)",
                       y0 + got / row, j->height);
                return;
            }
            if (zs->avail_in == 0 && !png_next_idat(j, zs, &at)) {
                png_refuse(j, (long long)at, "PNG image data ends in row %zu of %u (truncated)", y0 + got / row,
                       j->height);
                return;
            }
            size_t room = want - got < (1u << 30) ? want - got : (1u << 30);
            zs->next_out = rows + got;
            zs->avail_out = (unsigned int)room;
            rc = ing_z.inflate(zs, ING_Z_NO_FLUSH);
            got += room - zs->avail_out;
            if (rc != ING_Z_OK && rc != ING_Z_STREAM_END && rc != ING_Z_BUF_ERROR) {
                png_refuse(j, (long long)at, "PNG image data is corrupt: %s", png_zmessage(zs, rc));
                return;
            }
            ended = rc == ING_Z_STREAM_END;
        }
        for (size_t r = 0; r < n; ++r) {
            uint8_t *cur = rows + r * row;
            if (png_unfilter(cur, r ? cur - row : prev, row - 1, bpp) != 0) {
                png_refuse(j, -1, "PNG row %zu has filter type %d (0-4 allowed)", y0 + r, cur[0]);
                return;
            }
            if (!j->rgb) {
                png_store(j, cur + 1, j->out + (y0 + r) * stride);
            } else if (png_store_rgb(j, cur + 1, j->out + (y0 + r) * stride) != 0) {
                j->status = ING_PNG_PILLOW; /* an index past the palette: Pillow decides what it shows */
                return;
            }
        }
        memcpy(prev, rows + (n - 1) * row, row);
    }
    /* every row is in: the stream must end here, with nothing more to inflate */
    while (!ended) {
        uint8_t extra;
        zs->next_out = &extra;
        zs->avail_out = 1;
        if (zs->avail_in == 0 && !png_next_idat(j, zs, &at)) {
            png_refuse(j, (long long)at, "PNG image data stops before its zlib stream ends (truncated)");
            return;
        }
        rc = ing_z.inflate(zs, ING_Z_NO_FLUSH);
        if (zs->avail_out == 0) {
            png_refuse(j, (long long)at, "PNG image data holds more than its %u rows", j->height);
            return;
        }
        ended = rc == ING_Z_STREAM_END;
        if (!ended && rc != ING_Z_OK && rc != ING_Z_BUF_ERROR) {
            png_refuse(j, (long long)at, "PNG image data is corrupt: %s", png_zmessage(zs, rc));
            return;
        }
    }
    j->status = ING_PNG_DECODED;
}


/* A header that gave ING_PNG_DECODED, decoded into j->out: the chunks walked, the rows inflated (any thread). */
static void ing_png_decode(ing_png *j, ing_png_worker *wk) {
    size_t first_idat = 0;
    if (png_walk(j, wk, &first_idat) == ING_PNG_DECODED)
        png_inflate(j, wk, first_idat);
}

static void ing_png_worker_free(ing_png_worker *wk) {
    if (wk->zs_ready)
        ing_z.end(&wk->zs);
    free(wk->rows);
    wk->rows = NULL;
    wk->rows_size = 0;
    wk->zs_ready = 0;
}

#endif
