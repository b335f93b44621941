/* Palette and gray PNG masks of a batch decoded on native threads, with at most one GIL hand-off for the batch.
 *
 * ingest/decode/masks.py decodes masks with Pillow, which lets the GIL go and takes it back several times per
 * image; beside a busy Python thread every take-back can wait a switch interval. This module decodes the PNGs
 * a mask usually is (non-interlaced, one stored band) to exactly what Pillow's `np.array(img)` gives for them,
 * on native threads, and says which ones it leaves to Pillow:
 *
 *   colour type, bit depth        decoded to
 *   3 (palette) 1, 2, 4, 8        the indices, uint8
 *   0 (gray) 1                    0 and 1, uint8 (Pillow's mode "1", as decode_mask gives it)
 *   0 (gray) 8                    the levels, uint8
 *   0 (gray) 16                   the values, uint16 in the machine's byte order
 *   4 (gray + alpha) 8            the gray band, uint8
 *
 * Left to Pillow (the result None): no PNG signature; Adam7 interlacing; gray at 2 or 4 bits (Pillow scales
 * the levels); colour types 2 and 6 and 16-bit gray + alpha (Pillow makes them RGB/RGBA, which masks.py
 * refuses); animated PNGs (acTL/fcTL/fdAT); an unknown critical chunk; a palette image without PLTE; a gray
 * tRNS shorter than 2 bytes; data that ends at a chunk boundary without IEND. Everything else is decoded here
 * or refused with a message and the byte offset it concerns.
 *
 * What is checked (the PNG specification, W3C / RFC 2083): the signature; IHDR first, 13 bytes, its width and
 * height 1..2^31-1, its bit depth allowed for its colour type, compression and filter method 0, interlace 0 or
 * 1; every chunk's length (at most 2^31-1, inside the data), type (four ASCII letters) and CRC, IDAT's
 * included; one IHDR; IDATs consecutive; at least one IDAT; the filter type of each row (0-4); the zlib stream
 * (zlib checks its Adler-32) inflating to exactly height * (1 + row bytes) bytes and then ending. Width *
 * height is checked against max_pixels from IHDR before the output is allocated; the inflater works a block of rows
 * at a time, so memory stays the output plus 64 KiB (or two rows) whatever the compressed stream claims.
 *
 * zlib is loaded at run time (dlopen libz.so.1), so the module builds with no header but Python's.
 *
 * load() -> None or str: loads zlib (once); a message where it cannot (masks.py then uses Pillow only).
 *
 * decode(buffers, max_pixels, threads) -> list of n results
 *   buffers     sequence of n contiguous byte buffers (bytes, memoryview, uint8 arrays)
 *   max_pixels  masks with more pixels are refused from their IHDR
 *   threads     native threads to decode on (the calling thread is one of them)
 *   result k    None: left to Pillow; (message, offset or None): refused; (bytearray, height, width, itemsize):
 *               the values, row-major, itemsize 1 (uint8) or 2 (uint16)
 *
 * start(buffers, max_pixels, threads) -> pending: decode() begun on `threads` native threads of its own, returning
 *   at once (the headers read and the outputs allocated): the caller does other work meanwhile.
 * finish(pending) -> the list decode() gives. It waits without the GIL only while a thread is still decoding, so
 *   a batch that is done by then costs the caller no GIL hand-off at all. A pending batch dropped unfinished
 *   waits for its threads when it is freed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
} z_stream;

#define Z_OK 0
#define Z_STREAM_END 1
#define Z_NEED_DICT 2
#define Z_BUF_ERROR (-5)
#define Z_NO_FLUSH 0

static struct {
    void *lib;
    const char *(*version)(void);
    int (*init)(z_stream *, const char *, int);
    int (*inflate)(z_stream *, int);
    int (*reset)(z_stream *);
    int (*end)(z_stream *);
    unsigned long (*crc32)(unsigned long, const unsigned char *, unsigned int);
} z;

/* Loads zlib once (called with the GIL held); NULL or a message. */
static const char *load_zlib(void) {
    if (z.lib != NULL)
        return NULL;
    void *lib = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        return "cannot load libz.so.1";
    struct {
        const char *name;
        void **slot;
    } names[] = {
        {"zlibVersion", (void **)&z.version}, {"inflateInit_", (void **)&z.init},
        {"inflate", (void **)&z.inflate},     {"inflateReset", (void **)&z.reset},
        {"inflateEnd", (void **)&z.end},      {"crc32", (void **)&z.crc32},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; ++k) {
        *names[k].slot = dlsym(lib, names[k].name);
        if (*names[k].slot == NULL) {
            memset(&z, 0, sizeof z);
            dlclose(lib);
            return "libz.so.1 lacks a function the PNG decoder calls";
        }
    }
    z.lib = lib;
    return NULL;
}

/* -- one image ---------------------------------------------------------------------------------------------- */

enum { DECODED, PILLOW, REFUSED };

typedef struct {
    const uint8_t *data;
    size_t len;
    uint32_t width, height;
    int depth, ctype;
    uint8_t *out;       /* height * width * itemsize bytes */
    int status;
    long long offset;   /* of what the message is about; -1: none */
    char message[128];
} Job;

/* Rows are inflated this many bytes at a time (or one row, where a row is longer): zlib's fast inflate loop runs
 * only while it has 258 bytes of output room, so a row at a time would spend much of each row in its slow one. */
#define BLOCK ((size_t)65536)

/* What each worker thread keeps from one image to the next. */
typedef struct {
    z_stream zs;
    int zs_ready;
    uint8_t *rows;   /* the row above, then a block of rows, each with its filter byte */
    size_t rows_size;
} Worker;

static const uint8_t SIGNATURE[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int refuse(Job *j, long long offset, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(j->message, sizeof j->message, fmt, args);
    va_end(args);
    j->status = REFUSED;
    j->offset = offset;
    return REFUSED;
}

static int is_type(const uint8_t *type, const char *name) { return memcmp(type, name, 4) == 0; }

static int letters(const uint8_t *type) {
    for (int k = 0; k < 4; ++k)
        if (!((type[k] >= 'A' && type[k] <= 'Z') || (type[k] >= 'a' && type[k] <= 'z')))
            return 0;
    return 1;
}

/* The chunk at `pos` checked: inside the data, a lettered type, its CRC; its data length in *length. */
static int chunk(Job *j, size_t pos, uint32_t *length) {
    const uint8_t *d = j->data;
    if (j->len - pos < 12)
        return refuse(j, (long long)pos, "PNG data ends inside a chunk header (%zu bytes; no IEND)", j->len);
    *length = be32(d + pos);
    if (*length > 0x7FFFFFFFu)
        return refuse(j, (long long)pos, "PNG chunk length %u exceeds 2^31-1", *length);
    if (!letters(d + pos + 4))
        return refuse(j, (long long)pos, "PNG chunk type is not four ASCII letters");
    if (j->len - pos - 12 < *length)
        return refuse(j, (long long)pos, "PNG chunk '%.4s' of %u bytes runs past the end of the data (%zu bytes)",
                      (const char *)d + pos + 4, *length, j->len);
    if (z.crc32(0, d + pos + 4, *length + 4) != be32(d + pos + 8 + *length))
        return refuse(j, (long long)pos, "PNG chunk '%.4s' fails its CRC check", (const char *)d + pos + 4);
    return DECODED;
}

/* Signature and IHDR (with the GIL: no allocation here). PILLOW, REFUSED, or DECODED for one to decode. */
static int header(Job *j) {
    const uint8_t *d = j->data;
    if (j->len < 8 || memcmp(d, SIGNATURE, 8) != 0)
        return j->status = PILLOW;
    uint32_t length;
    if (chunk(j, 8, &length) != DECODED)
        return REFUSED;
    if (!is_type(d + 12, "IHDR") || length != 13)
        return refuse(j, 8, "PNG does not start with a 13-byte IHDR chunk");
    uint32_t w = be32(d + 16), h = be32(d + 20);
    int depth = d[24], ctype = d[25], interlace = d[28];
    if (w == 0 || h == 0 || w > 0x7FFFFFFFu || h > 0x7FFFFFFFu)
        return refuse(j, 16, "PNG IHDR: width and height must be 1..2^31-1, got %ux%u", w, h);
    int allowed;
    switch (ctype) {
    case 0: allowed = depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16; break;
    case 3: allowed = depth == 1 || depth == 2 || depth == 4 || depth == 8; break;
    case 2: case 4: case 6: allowed = depth == 8 || depth == 16; break;
    default: return refuse(j, 25, "PNG IHDR: colour type %d is not 0, 2, 3, 4 or 6", ctype);
    }
    if (!allowed)
        return refuse(j, 24, "PNG IHDR: bit depth %d is not allowed for colour type %d", depth, ctype);
    if (d[26] != 0 || d[27] != 0)
        return refuse(j, 26, "PNG IHDR: compression method %d and filter method %d must be 0", d[26], d[27]);
    if (interlace > 1)
        return refuse(j, 28, "PNG IHDR: interlace method %d is not 0 or 1", interlace);
    int native = interlace == 0 && (ctype == 3 || (ctype == 0 && depth != 2 && depth != 4) ||
                                    (ctype == 4 && depth == 8));
    if (!native)
        return j->status = PILLOW;
    j->width = w;
    j->height = h;
    j->depth = depth;
    j->ctype = ctype;
    return j->status = DECODED;
}

static uint8_t paeth(int a, int b, int c) {
    int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    return (uint8_t)(pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
}

/* Undoes the filter of `cur` (its filter byte first) against the row above, `prev`; -1 for an unknown type. */
static int unfilter(uint8_t *cur, const uint8_t *prev, size_t n, size_t bpp) {
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
            x[i] = (uint8_t)(x[i] + paeth(x[i - bpp], b[i], b[i - bpp]));
        return 0;
    default:
        return -1;
    }
}

/* One unfiltered row (no filter byte) to its output row. */
static void store(const Job *j, const uint8_t *x, uint8_t *o) {
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

/* Feeds the next IDAT's data to the inflater; 0 where the chunk after `*at` is not an IDAT (the chunks were
 * checked by the walk, up to IEND). */
static int next_idat(const Job *j, z_stream *zs, size_t *at) {
    for (;;) {
        size_t pos = *at + 12 + be32(j->data + *at);
        if (j->len - pos < 12 || !is_type(j->data + pos + 4, "IDAT"))
            return 0;
        *at = pos;
        zs->next_in = j->data + pos + 8;
        zs->avail_in = be32(j->data + pos);
        if (zs->avail_in > 0)
            return 1;
    }
}

static const char *zmessage(const z_stream *zs, int rc) {
    return zs->msg != NULL ? zs->msg : rc == Z_NEED_DICT ? "a preset dictionary, which PNG does not allow"
                                                         : "zlib error";
}

/* The chunks after IHDR up to IEND, each checked; DECODED (to go on) with the first IDAT's offset in *first_idat,
 * or PILLOW or REFUSED. */
static int walk(Job *j, size_t *first_idat) {
    size_t pos = 33;
    int idats = 0, plte = 0, after_idat = 0;
    for (;;) {
        uint32_t length;
        if (pos == j->len && idats > 0) /* no IEND: Pillow reads such files as far as their data goes */
            return j->status = PILLOW;
        if (chunk(j, pos, &length) != DECODED)
            return REFUSED;
        const uint8_t *type = j->data + pos + 4;
        if (is_type(type, "IDAT")) {
            if (after_idat)
                return refuse(j, (long long)pos, "PNG IDAT chunks are not consecutive");
            if (idats++ == 0)
                *first_idat = pos;
        } else {
            after_idat = idats > 0;
            if (is_type(type, "IEND"))
                break;
            if (is_type(type, "IHDR"))
                return refuse(j, (long long)pos, "PNG has a second IHDR chunk");
            if (is_type(type, "PLTE"))
                plte = 1;
            else if (is_type(type, "acTL") || is_type(type, "fcTL") || is_type(type, "fdAT") ||
                     (is_type(type, "tRNS") && j->ctype == 0 && length < 2) || !(type[0] & 0x20))
                return j->status = PILLOW; /* animation, a short gray tRNS, an unknown critical chunk */
        }
        pos += 12 + (size_t)length;
    }
    if (idats == 0)
        return refuse(j, (long long)pos, "PNG has no IDAT chunk");
    if (j->ctype == 3 && !plte)
        return j->status = PILLOW;
    return DECODED;
}

/* The IDATs' zlib stream inflated a block of rows at a time, each row unfiltered and stored (without the GIL). */
static void inflate_image(Job *j, Worker *wk, size_t at) {
    int channels = j->ctype == 4 ? 2 : 1;
    size_t bpp = (size_t)(channels * j->depth + 7) / 8;
    size_t row = ((size_t)j->width * channels * j->depth + 7) / 8 + 1; /* with its filter byte */
    size_t itemsize = j->depth == 16 ? 2 : 1, stride = (size_t)j->width * itemsize;
    size_t block = row < BLOCK ? BLOCK / row : 1; /* rows inflated per call */
    if (block > j->height)
        block = j->height;
    if (wk->rows_size < (block + 1) * row) {
        free(wk->rows);
        wk->rows_size = (block + 1) * row;
        wk->rows = malloc(wk->rows_size);
        if (wk->rows == NULL) {
            wk->rows_size = 0;
            refuse(j, -1, "out of memory for %zu rows of %zu bytes", block + 1, row);
            return;
        }
    }
    z_stream *zs = &wk->zs;
    int rc = wk->zs_ready ? z.reset(zs) : z.init(zs, z.version(), (int)sizeof(z_stream));
    if (rc != Z_OK) {
        refuse(j, -1, "zlib cannot start an inflater (%d)", rc);
        return;
    }
    wk->zs_ready = 1;
    uint8_t *prev = wk->rows, *rows = wk->rows + row;
    memset(prev, 0, row);
    zs->next_in = j->data + at + 8;
    zs->avail_in = be32(j->data + at);
    int ended = 0;
    for (uint32_t y0 = 0; y0 < j->height; y0 += (uint32_t)block) {
        size_t n = j->height - y0 < block ? j->height - y0 : block, want = n * row, got = 0;
        while (got < want) {
            if (ended) {
                refuse(j, (long long)at, "PNG image data ends in row %zu of %u (its zlib stream is complete)",
                       y0 + got / row, j->height);
                return;
            }
            if (zs->avail_in == 0 && !next_idat(j, zs, &at)) {
                refuse(j, (long long)at, "PNG image data ends in row %zu of %u (truncated)", y0 + got / row,
                       j->height);
                return;
            }
            size_t room = want - got < (1u << 30) ? want - got : (1u << 30);
            zs->next_out = rows + got;
            zs->avail_out = (unsigned int)room;
            rc = z.inflate(zs, Z_NO_FLUSH);
            got += room - zs->avail_out;
            if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
                refuse(j, (long long)at, "PNG image data is corrupt: %s", zmessage(zs, rc));
                return;
            }
            ended = rc == Z_STREAM_END;
        }
        for (size_t r = 0; r < n; ++r) {
            uint8_t *cur = rows + r * row;
            if (unfilter(cur, r ? cur - row : prev, row - 1, bpp) != 0) {
                refuse(j, -1, "PNG row %zu has filter type %d (0-4 allowed)", y0 + r, cur[0]);
                return;
            }
            store(j, cur + 1, j->out + (y0 + r) * stride);
        }
        memcpy(prev, rows + (n - 1) * row, row);
    }
    /* every row is in: the stream must end here, with nothing more to inflate */
    while (!ended) {
        uint8_t extra;
        zs->next_out = &extra;
        zs->avail_out = 1;
        if (zs->avail_in == 0 && !next_idat(j, zs, &at)) {
            refuse(j, (long long)at, "PNG image data stops before its zlib stream ends (truncated)");
            return;
        }
        rc = z.inflate(zs, Z_NO_FLUSH);
        if (zs->avail_out == 0) {
            refuse(j, (long long)at, "PNG image data holds more than its %u rows", j->height);
            return;
        }
        ended = rc == Z_STREAM_END;
        if (!ended && rc != Z_OK && rc != Z_BUF_ERROR) {
            refuse(j, (long long)at, "PNG image data is corrupt: %s", zmessage(zs, rc));
            return;
        }
    }
    j->status = DECODED;
}

/* -- a batch on native threads ------------------------------------------------------------------------------ */

#define MAX_THREADS 64

/* A batch from its inputs to its results: the buffers held, the jobs, the outputs, the threads decoding them. */
typedef struct {
    PyObject *seq, *outs; /* the buffers' sequence; n output bytearrays (NULL where not decoded) */
    Py_buffer *views;
    Py_ssize_t n, held;   /* held: views taken */
    Job *jobs;
    Py_ssize_t *todo;     /* indices of the jobs to decode */
    Py_ssize_t todo_n, next;
    pthread_t ids[MAX_THREADS];
    long started, finished; /* threads started (start()), and those done (atomic) */
    int joined;
} Pending;

static void *work(void *arg) {
    Pending *b = arg;
    Worker wk;
    memset(&wk, 0, sizeof wk);
    for (;;) {
        Py_ssize_t k = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (k >= b->todo_n)
            break;
        Job *j = &b->jobs[b->todo[k]];
        size_t first_idat = 0;
        if (walk(j, &first_idat) == DECODED)
            inflate_image(j, &wk, first_idat);
    }
    if (wk.zs_ready)
        z.end(&wk.zs);
    free(wk.rows);
    __atomic_add_fetch(&b->finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

static long thread_count(const Pending *b, long threads) {
    long t = threads < b->todo_n ? threads : (long)b->todo_n;
    return t < 1 ? 1 : t > MAX_THREADS ? MAX_THREADS : t;
}

/* Every job on up to `threads` threads, the caller's included; called without the GIL. */
static void run(Pending *b, long threads) {
    pthread_t ids[MAX_THREADS];
    long extra = thread_count(b, threads) - 1, started = 0;
    for (; started < extra; ++started)
        if (pthread_create(&ids[started], NULL, work, b) != 0)
            break; /* fewer threads: the rest still gets done */
    work(b);
    for (long t = 0; t < started; ++t)
        pthread_join(ids[t], NULL);
}

/* Waits for start()'s threads: without the GIL unless all have finished (then joining them takes no time). */
static void join(Pending *b) {
    if (b->joined)
        return;
    if (__atomic_load_n(&b->finished, __ATOMIC_ACQUIRE) < b->started) {
        Py_BEGIN_ALLOW_THREADS
        for (long t = 0; t < b->started; ++t)
            pthread_join(b->ids[t], NULL);
        Py_END_ALLOW_THREADS
    } else {
        for (long t = 0; t < b->started; ++t)
            pthread_join(b->ids[t], NULL);
    }
    b->joined = 1;
}

static void pending_free(Pending *b) {
    join(b);
    for (Py_ssize_t k = 0; k < b->held; k++)
        PyBuffer_Release(&b->views[k]);
    PyMem_Free(b->views);
    PyMem_Free(b->jobs);
    PyMem_Free(b->todo);
    Py_XDECREF(b->outs);
    Py_XDECREF(b->seq);
    PyMem_Free(b);
}

/* The batch's headers read and its outputs allocated (with the GIL); NULL with an exception set. */
static Pending *prepare(PyObject *buffers, long long max_pixels) {
    if (z.lib == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "zlib is not loaded (call load() first)");
        return NULL;
    }
    Pending *b = PyMem_Calloc(1, sizeof(Pending));
    if (b == NULL)
        return (Pending *)PyErr_NoMemory();
    b->joined = 1; /* no threads yet */
    if ((b->seq = PySequence_Fast(buffers, "buffers must be a sequence")) == NULL)
        goto fail;
    Py_ssize_t n = b->n = PySequence_Fast_GET_SIZE(b->seq);
    b->views = PyMem_Calloc(n > 0 ? n : 1, sizeof(Py_buffer));
    b->jobs = PyMem_Calloc(n > 0 ? n : 1, sizeof(Job));
    b->todo = PyMem_Calloc(n > 0 ? n : 1, sizeof(Py_ssize_t));
    if (b->views == NULL || b->jobs == NULL || b->todo == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if ((b->outs = PyList_New(n)) == NULL)
        goto fail;
    for (; b->held < n; b->held++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(b->seq, b->held), &b->views[b->held], PyBUF_C_CONTIGUOUS) < 0)
            goto fail;
    for (Py_ssize_t k = 0; k < n; ++k) {
        Job *j = &b->jobs[k];
        j->data = b->views[k].buf;
        j->len = (size_t)b->views[k].len;
        j->offset = -1;
        if (header(j) != DECODED)
            continue;
        if ((long long)j->width * j->height > max_pixels) {
            refuse(j, -1, "mask of %ux%u pixels exceeds max_pixels=%lld", j->width, j->height, max_pixels);
            continue;
        }
        Py_ssize_t size = (Py_ssize_t)j->width * j->height * (j->depth == 16 ? 2 : 1);
        PyObject *out = PyByteArray_FromStringAndSize(NULL, size);
        if (out == NULL)
            goto fail;
        PyList_SET_ITEM(b->outs, k, out);
        j->out = (uint8_t *)PyByteArray_AS_STRING(out);
        b->todo[b->todo_n++] = k;
    }
    return b;
fail:
    pending_free(b);
    return NULL;
}

/* The results (see the top of this file); the batch decoded and joined. */
static PyObject *results(Pending *b) {
    PyObject *result = PyList_New(b->n);
    if (result == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < b->n; ++k) {
        Job *j = &b->jobs[k];
        PyObject *item;
        if (j->status == PILLOW) {
            item = Py_None;
            Py_INCREF(item);
        } else if (j->status == REFUSED) {
            item = j->offset < 0 ? Py_BuildValue("(sO)", j->message, Py_None)
                                 : Py_BuildValue("(sL)", j->message, j->offset);
        } else {
            item = Py_BuildValue("(OIIi)", PyList_GET_ITEM(b->outs, k), j->height, j->width, j->depth == 16 ? 2 : 1);
        }
        if (item == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyList_SET_ITEM(result, k, item);
    }
    return result;
}

/* -- Python ------------------------------------------------------------------------------------------------- */

static PyObject *py_load(PyObject *self, PyObject *noargs) {
    const char *message = load_zlib();
    if (message != NULL)
        return PyUnicode_FromString(message);
    Py_RETURN_NONE;
}

/* decode's and start's arguments (buffers, max_pixels, threads), prepared; NULL with an exception set. */
static Pending *prepare_args(PyObject *args, const char *format, long *threads) {
    PyObject *buffers;
    long long max_pixels;
    if (!PyArg_ParseTuple(args, format, &buffers, &max_pixels, threads))
        return NULL;
    return prepare(buffers, max_pixels);
}

static PyObject *py_decode(PyObject *self, PyObject *args) {
    long threads;
    Pending *b = prepare_args(args, "OLl:decode", &threads);
    if (b == NULL)
        return NULL;
    if (b->todo_n > 0) {
        Py_BEGIN_ALLOW_THREADS
        run(b, threads);
        Py_END_ALLOW_THREADS
    }
    PyObject *result = results(b);
    pending_free(b);
    return result;
}

#define CAPSULE "ingest.decode._png.Pending"

static void capsule_free(PyObject *capsule) {
    Pending *b = PyCapsule_GetPointer(capsule, CAPSULE);
    if (b != NULL)
        pending_free(b);
}

static PyObject *py_start(PyObject *self, PyObject *args) {
    long threads;
    Pending *b = prepare_args(args, "OLl:start", &threads);
    if (b == NULL)
        return NULL;
    b->joined = 0;
    if (b->todo_n > 0) {
        long want = thread_count(b, threads);
        while (b->started < want && pthread_create(&b->ids[b->started], NULL, work, b) == 0)
            b->started++;
        if (b->started == 0) { /* no thread could start: decode here */
            Py_BEGIN_ALLOW_THREADS
            run(b, 1);
            Py_END_ALLOW_THREADS
        }
    }
    PyObject *capsule = PyCapsule_New(b, CAPSULE, capsule_free);
    if (capsule == NULL)
        pending_free(b);
    return capsule;
}

static PyObject *py_finish(PyObject *self, PyObject *capsule) {
    Pending *b = PyCapsule_GetPointer(capsule, CAPSULE);
    if (b == NULL)
        return NULL;
    join(b);
    PyObject *result = results(b);
    if (result != NULL) { /* finished with: freed now, not when the capsule goes */
        PyCapsule_SetDestructor(capsule, NULL);
        PyCapsule_SetName(capsule, CAPSULE ".finished");
        pending_free(b);
    }
    return result;
}

static PyMethodDef methods[] = {
    {"load", py_load, METH_NOARGS, "Load zlib; None, or why it cannot (see the top of ingest/decode/_png.c)."},
    {"decode", py_decode, METH_VARARGS, "PNG masks of a batch (see the top of ingest/decode/_png.c)."},
    {"start", py_start, METH_VARARGS, "decode() started on native threads (see the top of ingest/decode/_png.c)."},
    {"finish", py_finish, METH_O, "start()'s results (see the top of ingest/decode/_png.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_png", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__png(void) { return PyModule_Create(&module); }
