/* JPEG headers of a whole batch in one call: the same reading as ingest/decode/cpu.py's read_jpeg_header (which
 * stays the reference and the fallback where this module was not built), without a Python object per image.
 * tests/test_jpeg_headers.py checks the two agree on real, hostile and random inputs.
 *
 * The GIL is kept: 256 headers take ~20 us, and handing the GIL over beside a busy Python thread costs up to a
 * switch interval (5 ms) to get it back (256 headers: 0.02 ms alone, 6.5 ms beside a busy thread released).
 *
 * headers(buffers, out) -> None
 *   buffers  a sequence of n contiguous byte buffers (bytes, memoryview, uint8 arrays)
 *   out      writable int64 buffer of n * 9: per image, the columns of decode.HEADER_COLUMNS:
 *            kind (0 no JPEG signature, 1 frame header found, 2 JPEG without one), height, width, components,
 *            precision, process (the SOF marker), orientation (1-8), rgb (0/1), eoi (ends with FF D9: 0/1).
 *            For kind 0 and 2 only kind and eoi are set; the rest are 0.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define COLUMNS 9

static const unsigned char XMP_PREFIX[] = "http://ns.adobe.com/xap/1.0/"; /* + its NUL: 29 bytes */
static const unsigned char XMP_KEY[] = "tiff:Orientation";

static int is_sof(int m) {
    return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}

static int is_standalone(int m) { return m == 0x01 || (m >= 0xD0 && m <= 0xD7); }

/* Unsigned value of `size` (2 or 4) bytes at `at` of [p, p + n) in byte order `big`; -1 past the end. */
static int64_t tiff_uint(const unsigned char *p, Py_ssize_t n, int64_t at, int size, int big) {
    if (at < 0 || at + size > n)
        return -1;
    uint32_t v = 0;
    for (int i = 0; i < size; i++)
        v |= (uint32_t)p[at + i] << (8 * (big ? size - 1 - i : i));
    return v;
}

/* The Orientation tag of IFD0 of a TIFF block, or -1 (absent or unreadable): decode.py's _tiff_orientation. */
static int64_t tiff_orientation(const unsigned char *p, Py_ssize_t n) {
    int big;
    if (n >= 2 && p[0] == 'I' && p[1] == 'I')
        big = 0;
    else if (n >= 2 && p[0] == 'M' && p[1] == 'M')
        big = 1;
    else
        return -1;
    int64_t ifd = tiff_uint(p, n, 4, 4, big);
    if (ifd < 0)
        return -1;
    int64_t count = tiff_uint(p, n, ifd, 2, big);
    if (count < 0)
        return -1;
    for (int64_t entry = ifd + 2; entry < ifd + 2 + 12 * count; entry += 12) {
        int64_t tag = tiff_uint(p, n, entry, 2, big), kind = tiff_uint(p, n, entry + 2, 2, big);
        if (tag < 0 || kind < 0)
            return -1;
        if (tag == 0x0112) {
            if (kind == 3)
                return tiff_uint(p, n, entry + 8, 2, big);
            if (kind == 4)
                return tiff_uint(p, n, entry + 8, 4, big);
            return -1;
        }
    }
    return -1;
}

/* The digit after the first 'tiff:Orientation="' or 'tiff:Orientation>' of [p, p + n), or -1. */
static int64_t xmp_orientation(const unsigned char *p, Py_ssize_t n) {
    const Py_ssize_t key = sizeof(XMP_KEY) - 1;
    for (Py_ssize_t i = 0; i + key < n; i++) {
        if (p[i] != 't' || memcmp(p + i, XMP_KEY, key) != 0)
            continue;
        Py_ssize_t j = i + key;
        if (j + 2 < n && p[j] == '=' && p[j + 1] == '"' && p[j + 2] >= '0' && p[j + 2] <= '9')
            return p[j + 2] - '0';
        if (j + 1 < n && p[j] == '>' && p[j + 1] >= '0' && p[j + 1] <= '9')
            return p[j + 1] - '0';
    }
    return -1;
}

/* One image into row[0..COLUMNS). */
static void scan(const unsigned char *b, Py_ssize_t size, int64_t *row) {
    memset(row, 0, COLUMNS * sizeof(int64_t));
    row[8] = size >= 2 && b[size - 2] == 0xFF && b[size - 1] == 0xD9;
    if (size < 3 || b[0] != 0xFF || b[1] != 0xD8 || b[2] != 0xFF)
        return;
    int found = 0, adobe = -1, ids_rgb = 0;
    int64_t exif = -1, xmp = -1;
    Py_ssize_t pos = 2;
    while (pos + 1 < size) {
        int marker;
        if (b[pos] == 0xFF && b[pos + 1] != 0x00 && b[pos + 1] != 0xFF) {
            marker = b[pos + 1];
            pos += 2;
        } else { /* a run of 0xFF then a byte that is neither 0x00 nor 0xFF, searched from pos */
            Py_ssize_t i = pos;
            marker = -1;
            while (i < size) {
                if (b[i] != 0xFF) {
                    i++;
                    continue;
                }
                Py_ssize_t j = i;
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
        if (is_standalone(marker))
            continue;
        if (marker == 0xD9 || marker == 0xDA || pos + 2 > size)
            break;
        Py_ssize_t length = ((Py_ssize_t)b[pos] << 8) | b[pos + 1];
        Py_ssize_t start = pos + 2;
        pos += length;
        if (!(is_sof(marker) || marker == 0xE1 || marker == 0xEE))
            continue;
        Py_ssize_t end = pos < size ? pos : size;
        const unsigned char *seg = b + start;
        Py_ssize_t n = end > start ? end - start : 0;
        if (is_sof(marker) && !found && n >= 6) {
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
            exif = tiff_orientation(seg + 6, n - 6);
        } else if (marker == 0xE1 && n >= (Py_ssize_t)sizeof(XMP_PREFIX) &&
                   memcmp(seg, XMP_PREFIX, sizeof(XMP_PREFIX)) == 0 && xmp < 0) {
            xmp = xmp_orientation(seg, n);
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

static PyObject *py_headers(PyObject *self, PyObject *args) {
    PyObject *buffers, *out_obj;
    if (!PyArg_ParseTuple(args, "OO:headers", &buffers, &out_obj))
        return NULL;
    PyObject *seq = PySequence_Fast(buffers, "buffers must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer out;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    PyObject *result = NULL;
    Py_buffer *views = NULL;
    Py_ssize_t held = 0;
    if (out.len != n * COLUMNS * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_Format(PyExc_ValueError, "out must hold %zd int64 values", n * COLUMNS);
        goto done;
    }
    views = PyMem_Calloc(n > 0 ? n : 1, sizeof(Py_buffer));
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < n; held++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &views[held], PyBUF_C_CONTIGUOUS) < 0)
            goto done;
    int64_t *rows = out.buf;
    for (Py_ssize_t k = 0; k < n; k++)
        scan(views[k].buf, views[k].len, rows + k * COLUMNS);
    result = Py_None;
    Py_INCREF(result);
done:
    for (Py_ssize_t k = 0; k < held; k++)
        PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    PyBuffer_Release(&out);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"headers", py_headers, METH_VARARGS, "JPEG headers of a batch (see the top of ingest/decode/_jpeg.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_jpeg", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__jpeg(void) { return PyModule_Create(&module); }
