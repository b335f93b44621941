/* The JPEG header scan of one image, pure C (no Python): the same reading as ingest/decode/cpu.py's
 * read_jpeg_header. Included by ingest/formats/_jpeg.c (a batch of headers for Python) and the native engine
 * (ingest/_native/engine.c), so both read headers with one piece of code.
 *
 * ing_jpeg_scan(bytes, size, row) fills row[0..ING_JPEG_COLUMNS), the columns of decode.cpu.HEADER_COLUMNS:
 *   kind (0 no JPEG signature, 1 frame header found, 2 JPEG without one), height, width, components,
 *   precision, process (the SOF marker), orientation (1-8), rgb (0/1), eoi (ends with FF D9: 0/1).
 *   For kind 0 and 2 only kind and eoi are set; the rest are 0.
 */
#ifndef INGEST_NATIVE_JPEG_SCAN_H
#define INGEST_NATIVE_JPEG_SCAN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define ING_JPEG_COLUMNS 9

static const unsigned char ING_XMP_PREFIX[] = "http://ns.adobe.com/xap/1.0/"; /* + its NUL: 29 bytes */
static const unsigned char ING_XMP_KEY[] = "tiff:Orientation";

static inline int ing_jpeg_is_sof(int m) {
    return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}

static inline int ing_jpeg_is_standalone(int m) { return m == 0x01 || (m >= 0xD0 && m <= 0xD7); }

/* Unsigned value of `size` (2 or 4) bytes at `at` of [p, p + n) in byte order `big`; -1 past the end. */
static inline int64_t ing_jpeg_tiff_uint(const unsigned char *p, ptrdiff_t n, int64_t at, int size, int big) {
    if (at < 0 || at + size > n)
        return -1;
    uint32_t v = 0;
    for (int i = 0; i < size; i++)
        v |= (uint32_t)p[at + i] << (8 * (big ? size - 1 - i : i));
    return v;
}

/* The Orientation tag of IFD0 of a TIFF block, or -1 (absent or unreadable): decode.py's _tiff_orientation. */
static inline int64_t ing_jpeg_tiff_orientation(const unsigned char *p, ptrdiff_t n) {
    int big;
    if (n >= 2 && p[0] == 'I' && p[1] == 'I')
        big = 0;
    else if (n >= 2 && p[0] == 'M' && p[1] == 'M')
        big = 1;
    else
        return -1;
    int64_t ifd = ing_jpeg_tiff_uint(p, n, 4, 4, big);
    if (ifd < 0)
        return -1;
    int64_t count = ing_jpeg_tiff_uint(p, n, ifd, 2, big);
    if (count < 0)
        return -1;
    for (int64_t entry = ifd + 2; entry < ifd + 2 + 12 * count; entry += 12) {
        int64_t tag = ing_jpeg_tiff_uint(p, n, entry, 2, big), kind = ing_jpeg_tiff_uint(p, n, entry + 2, 2, big);
        if (tag < 0 || kind < 0)
            return -1;
        if (tag == 0x0112) {
            if (kind == 3)
                return ing_jpeg_tiff_uint(p, n, entry + 8, 2, big);
            if (kind == 4)
                return ing_jpeg_tiff_uint(p, n, entry + 8, 4, big);
            return -1;
        }
    }
    return -1;
}

/* The digit after the first 'tiff:Orientation="' or 'tiff:Orientation>' of [p, p + n), or -1. */
static inline int64_t ing_jpeg_xmp_orientation(const unsigned char *p, ptrdiff_t n) {
    const ptrdiff_t key = sizeof(ING_XMP_KEY) - 1;
    for (ptrdiff_t i = 0; i + key < n; i++) {
        if (p[i] != 't' || memcmp(p + i, ING_XMP_KEY, key) != 0)
            continue;
        ptrdiff_t j = i + key;
        if (j + 2 < n && p[j] == '=' && p[j + 1] == '"' && p[j + 2] >= '0' && p[j + 2] <= '9')
            return p[j + 2] - '0';
        if (j + 1 < n && p[j] == '>' && p[j + 1] >= '0' && p[j + 1] <= '9')
            return p[j + 1] - '0';
    }
    return -1;
}

/* One image into row[0..ING_JPEG_COLUMNS). */
static inline void ing_jpeg_scan(const unsigned char *b, ptrdiff_t size, int64_t *row) {
    memset(row, 0, ING_JPEG_COLUMNS * sizeof(int64_t));
    row[8] = size >= 2 && b[size - 2] == 0xFF && b[size - 1] == 0xD9;
    if (size < 3 || b[0] != 0xFF || b[1] != 0xD8 || b[2] != 0xFF)
        return;
    int found = 0, adobe = -1, ids_rgb = 0;
    int64_t exif = -1, xmp = -1;
    ptrdiff_t pos = 2;
    while (pos + 1 < size) {
        int marker;
        if (b[pos] == 0xFF && b[pos + 1] != 0x00 && b[pos + 1] != 0xFF) {
            marker = b[pos + 1];
            pos += 2;
        } else { /* a run of 0xFF then a byte that is neither 0x00 nor 0xFF, searched from pos */
            ptrdiff_t i = pos;
            marker = -1;
            while (i < size) {
                if (b[i] != 0xFF) {
                    i++;
                    continue;
                }
                ptrdiff_t j = i;
                while (j < size && b[j] == 0xFF)
                    j++;
                if (j < size && b[j] != 0x00) {
                    marker = b[j];
                    pos = j + 1;
                    break;
                }
                i = j;
            }
            if (marker < 0)
                break;
        }
        if (ing_jpeg_is_standalone(marker))
            continue;
        if (marker == 0xD9 || marker == 0xDA || pos + 2 > size)
            break;
        ptrdiff_t length = ((ptrdiff_t)b[pos] << 8) | b[pos + 1];
        ptrdiff_t start = pos + 2;
        pos += length;
        if (!(ing_jpeg_is_sof(marker) || marker == 0xE1 || marker == 0xEE))
            continue;
        ptrdiff_t end = pos < size ? pos : size;
        const unsigned char *seg = b + start;
        ptrdiff_t n = end > start ? end - start : 0;
        if (ing_jpeg_is_sof(marker) && !found && n >= 6) {
            found = 1;
            row[4] = seg[0];
            row[1] = (seg[1] << 8) | seg[2];
            row[2] = (seg[3] << 8) | seg[4];
            row[3] = seg[5];
            row[5] = marker;
            /* component ids: bytes 6, 9, 12, ... of the segment, as many as there are components */
            ids_rgb = seg[5] == 3 && n > 12 && seg[6] == 'R' && seg[9] == 'G' && seg[12] == 'B';
        } else if (marker == 0xEE && n >= 12 && memcmp(seg, "Adobe", 5) == 0) {
            adobe = seg[11];
        } else if (marker == 0xE1 && n >= 6 && memcmp(seg, "Exif\0\0", 6) == 0 && exif < 0) {
            exif = ing_jpeg_tiff_orientation(seg + 6, n - 6);
        } else if (marker == 0xE1 && n >= (ptrdiff_t)sizeof(ING_XMP_PREFIX) &&
                   memcmp(seg, ING_XMP_PREFIX, sizeof(ING_XMP_PREFIX)) == 0 && xmp < 0) {
            xmp = ing_jpeg_xmp_orientation(seg, n);
        }
    }
    if (!found) {
        row[0] = 2;
        return;
    }
    row[0] = 1;
    /* `exif or xmp` in Python: a missing or zero EXIF value gives way to XMP */
    int64_t orientation = exif > 0 ? exif : xmp;
    row[6] = orientation >= 1 && orientation <= 8 ? orientation : 1;
    row[7] = row[3] == 3 && (adobe == 0 || (adobe < 0 && ids_rgb));
}

#endif
