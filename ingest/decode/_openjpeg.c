/* OpenJPEG's decode area in one call that gives the GIL up once: ingest/decode/openjpeg.py's core.
 *
 * Driving libopenjp2 through ctypes takes the GIL back at every call's return and in every stream and message
 * callback, a few dozen times an image; beside a busy Python thread each take-back can wait a switch interval,
 * which made an area decode several times slower than imagecodecs' whole decode there. Here the header, the area,
 * the decode and the copy into the caller's array run in C between one Py_BEGIN_ALLOW_THREADS and its end.
 *
 * libopenjp2 is opened at run time (the copy Pillow's wheels bundle, or the system's: openjpeg.py finds it), so
 * building needs no OpenJPEG header: the few structs and signatures used are OpenJPEG 2.x's public ones
 * (openjpeg.h: opj_image_t, opj_image_comp_t, the stream callbacks).
 *
 * load(path) -> str: opens the library with every function used (once; later calls return the same version) and
 *   returns opj_version(); OSError where it cannot.
 *
 * decode_area(data, x0, y0, x1, y1, jp2, out) -> None
 *   data     a contiguous byte buffer: a JP2 file (jp2 true) or a bare codestream
 *   x0..x1   the area, in image pixels (from the image's origin on the reference grid)
 *   out      a writable uint8 or uint16 buffer [y1 - y0, x1 - x0] (one component) or [y1 - y0, x1 - x0, C], whose
 *            rows may be strided (a view into a whole image) but whose pixels are packed
 *   The area's samples are written into out, each cast to out's type. Failed(what, messages) where OpenJPEG
 *   fails ("setup", "header", "area", "decode") or decodes what out cannot hold ("components", with what it
 *   decoded); the library prints nothing (its error and warning messages are kept for that error, its info
 *   messages dropped). ValueError for an empty area or an out of another shape or type.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dlsyms.h"

/* -- OpenJPEG 2.x's public types (openjpeg.h) ---------------------------------------------------------------- */

typedef struct {
    uint32_t dx, dy, w, h, x0, y0, prec, bpp, sgnd, resno_decoded, factor;
    int32_t *data;
    uint16_t alpha;
} opj_comp;

typedef struct {
    uint32_t x0, y0, x1, y1, numcomps;
    int color_space;
    opj_comp *comps;
    unsigned char *icc_profile_buf;
    uint32_t icc_profile_len;
} opj_img;

typedef size_t (*read_fn)(void *, size_t, void *);
typedef int64_t (*skip_fn)(int64_t, void *);
typedef int (*seek_fn)(int64_t, void *);
typedef void (*msg_fn)(const char *, void *);

#define CODEC_J2K 0
#define CODEC_JP2 2
#define CHUNK (1 << 20)           /* the stream's buffer: OpenJPEG's own default */
#define PARAMETERS_BYTES (1 << 15) /* room for opj_dparameters_t (about 8.3 KB in 2.x), filled by the library */

static struct {
    const char *(*version)(void);
    void *(*create_decompress)(int);
    void (*set_default_decoder_parameters)(void *);
    int (*setup_decoder)(void *, void *);
    int (*set_error_handler)(void *, msg_fn, void *);
    int (*set_warning_handler)(void *, msg_fn, void *);
    int (*set_info_handler)(void *, msg_fn, void *);
    void *(*stream_create)(size_t, int);
    void (*stream_set_read_function)(void *, read_fn);
    void (*stream_set_skip_function)(void *, skip_fn);
    void (*stream_set_seek_function)(void *, seek_fn);
    void (*stream_set_user_data)(void *, void *, void (*)(void *));
    void (*stream_set_user_data_length)(void *, uint64_t);
    int (*read_header)(void *, void *, opj_img **);
    int (*set_decode_area)(void *, opj_img *, int32_t, int32_t, int32_t, int32_t);
    int (*decode)(void *, void *, opj_img *);
    int (*end_decompress)(void *, void *);
    void (*image_destroy)(opj_img *);
    void (*stream_destroy)(void *);
    void (*destroy_codec)(void *);
} opj;

static void *library;
static PyObject *Failed; /* (what, messages): OpenJPEG failed, or decoded what out cannot hold */

#define SYM(name) {"opj_" #name, (void **)&opj.name}
static const ing_symbol SYMBOLS[] = {
    SYM(version), SYM(create_decompress), SYM(set_default_decoder_parameters), SYM(setup_decoder),
    SYM(set_error_handler), SYM(set_warning_handler), SYM(set_info_handler), SYM(stream_create),
    SYM(stream_set_read_function), SYM(stream_set_skip_function), SYM(stream_set_seek_function),
    SYM(stream_set_user_data), SYM(stream_set_user_data_length), SYM(read_header), SYM(set_decode_area),
    SYM(decode), SYM(end_decompress), SYM(image_destroy), SYM(stream_destroy), SYM(destroy_codec),
};

/* -- one decode ---------------------------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *data;
    size_t size, at;
} source;

static size_t source_read(void *dst, size_t n, void *user) {
    source *s = user;
    size_t left = s->size - s->at;
    if (left == 0)
        return (size_t)-1; /* (OPJ_SIZE_T)-1: the end of the stream */
    n = n < left ? n : left;
    memcpy(dst, s->data + s->at, n);
    s->at += n;
    return n;
}

static int64_t source_skip(int64_t n, void *user) {
    source *s = user;
    int64_t to = (int64_t)s->at + n;
    to = to < 0 ? 0 : to > (int64_t)s->size ? (int64_t)s->size : to;
    int64_t moved = to - (int64_t)s->at;
    s->at = (size_t)to;
    return moved;
}

static int source_seek(int64_t n, void *user) {
    source *s = user;
    if (n < 0 || n > (int64_t)s->size)
        return 0;
    s->at = (size_t)n;
    return 1;
}

typedef struct {
    char text[1024];
    size_t len;
} said;

static void keep_message(const char *msg, void *user) {
    said *m = user;
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' ' || msg[n - 1] == '\r'))
        --n;
    if (n == 0 || m->len + 3 >= sizeof m->text)
        return;
    if (m->len) {
        memcpy(m->text + m->len, "; ", 2);
        m->len += 2;
    }
    size_t room = sizeof m->text - 1 - m->len;
    n = n < room ? n : room;
    memcpy(m->text + m->len, msg, n);
    m->len += n;
    m->text[m->len] = '\0';
}

static void drop_message(const char *msg, void *user) {}

typedef struct {
    char *base;                    /* out's first sample */
    Py_ssize_t h, w, comps, itemsize, row_stride;
} target;

/* The area decoded into `out`; NULL on success, else the stage that failed (its messages in `m`). Runs without
 * the GIL. */
static const char *decode_into(const source *src_in, int jp2, int32_t x0, int32_t y0, int32_t x1, int32_t y1,
                               const target *out, said *m) {
    source src = *src_in;
    const char *failed = NULL;
    opj_img *image = NULL;
    unsigned char params[PARAMETERS_BYTES];
    void *codec = opj.create_decompress(jp2 ? CODEC_JP2 : CODEC_J2K);
    void *stream = opj.stream_create(CHUNK, 1);
    if (codec == NULL || stream == NULL) {
        failed = "setup";
        goto done;
    }
    opj.set_error_handler(codec, keep_message, m);
    opj.set_warning_handler(codec, keep_message, m);
    opj.set_info_handler(codec, drop_message, NULL);
    opj.set_default_decoder_parameters(params);
    if (!opj.setup_decoder(codec, params)) {
        failed = "setup";
        goto done;
    }
    opj.stream_set_read_function(stream, source_read);
    opj.stream_set_skip_function(stream, source_skip);
    opj.stream_set_seek_function(stream, source_seek);
    opj.stream_set_user_data(stream, &src, NULL);
    opj.stream_set_user_data_length(stream, src.size);
    if (!opj.read_header(stream, codec, &image)) {
        failed = "header";
        goto done;
    }
    /* the area on the reference grid, which the signed arguments must hold */
    if ((int64_t)image->x0 + x1 > INT32_MAX || (int64_t)image->y0 + y1 > INT32_MAX ||
        !opj.set_decode_area(codec, image, (int32_t)(image->x0 + (uint32_t)x0), (int32_t)(image->y0 + (uint32_t)y0),
                             (int32_t)(image->x0 + (uint32_t)x1), (int32_t)(image->y0 + (uint32_t)y1))) {
        failed = "area";
        goto done;
    }
    if (!opj.decode(codec, stream, image) || !opj.end_decompress(codec, stream)) {
        failed = "decode";
        goto done;
    }
    int fits = image->numcomps == (uint32_t)out->comps;
    for (uint32_t c = 0; fits && c < image->numcomps; ++c) {
        const opj_comp *k = &image->comps[c];
        fits = k->w == (uint32_t)out->w && k->h == (uint32_t)out->h && !k->sgnd && k->data != NULL &&
               k->prec <= 8 * (uint32_t)out->itemsize;
    }
    if (!fits) {
        const opj_comp *k = image->numcomps ? &image->comps[0] : NULL;
        m->len = (size_t)snprintf(m->text, sizeof m->text,
                                  "%u decoded, the first %ux%u of %u bits%s, for %zdx%zd x %zd of %zd bytes",
                                  image->numcomps, k ? k->w : 0, k ? k->h : 0, k ? k->prec : 0,
                                  k && k->sgnd ? " signed" : "", out->w, out->h, out->comps, out->itemsize);
        m->len = m->len < sizeof m->text ? m->len : sizeof m->text - 1;
        failed = "components";
        goto done;
    }
    for (Py_ssize_t y = 0; y < out->h; ++y) {
        char *row = out->base + y * out->row_stride;
        for (Py_ssize_t c = 0; c < out->comps; ++c) {
            const int32_t *from = image->comps[c].data + y * out->w;
            if (out->itemsize == 1) {
                uint8_t *to = (uint8_t *)row + c;
                for (Py_ssize_t x = 0; x < out->w; ++x)
                    to[x * out->comps] = (uint8_t)from[x];
            } else {
                uint16_t *to = (uint16_t *)row + c;
                for (Py_ssize_t x = 0; x < out->w; ++x)
                    to[x * out->comps] = (uint16_t)from[x];
            }
        }
    }
done:
    if (image != NULL)
        opj.image_destroy(image);
    if (stream != NULL)
        opj.stream_destroy(stream);
    if (codec != NULL)
        opj.destroy_codec(codec);
    return failed;
}

/* -- Python ---------------------------------------------------------------------------------------------------- */

static PyObject *py_load(PyObject *self, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s:load", &path))
        return NULL;
    if (library == NULL) {
        int missing;
        library = ing_dlopen_all(path, SYMBOLS, sizeof SYMBOLS / sizeof SYMBOLS[0], &missing);
        if (library == NULL)
            return PyErr_Format(PyExc_OSError, "%s: %s", path,
                                missing ? "a function ingest calls is missing (OpenJPEG 2.3 or later needed)"
                                        : dlerror());
    }
    return PyUnicode_FromString(opj.version());
}

static PyObject *py_decode_area(PyObject *self, PyObject *args) {
    Py_buffer data, view;
    PyObject *target_obj;
    int x0, y0, x1, y1, jp2;
    if (library == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "libopenjp2 is not loaded (call load first)");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*iiiipO:decode_area", &data, &x0, &y0, &x1, &y1, &jp2, &target_obj))
        return NULL;
    if (PyObject_GetBuffer(target_obj, &view, PyBUF_RECORDS) < 0) { /* writable, with strides and type */
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    const char *format = view.format ? view.format : "B";
    if (*format == '=' || *format == '<' || *format == '@')
        ++format;
    Py_ssize_t comps = view.ndim == 3 ? view.shape[2] : 1;
    int packed = (view.ndim == 2 || view.ndim == 3) && view.strides[view.ndim - 1] == view.itemsize &&
                 (view.ndim == 2 || view.strides[1] == comps * view.itemsize);
    int typed = (view.itemsize == 1 && strcmp(format, "B") == 0) || (view.itemsize == 2 && strcmp(format, "H") == 0);
    if (x1 <= x0 || y1 <= y0 || x0 < 0 || y0 < 0) {
        PyErr_Format(PyExc_ValueError, "an empty or negative area %d,%d-%d,%d", x0, y0, x1, y1);
        goto out;
    }
    if (!packed || !typed || view.shape[0] != y1 - y0 || view.shape[1] != x1 - x0) {
        PyErr_Format(PyExc_ValueError, "out must be a uint8 or uint16 array [%d, %d] or [%d, %d, C] with packed "
                                       "pixels", y1 - y0, x1 - x0, y1 - y0, x1 - x0);
        goto out;
    }
    source src = {data.buf, (size_t)data.len, 0};
    target t = {view.buf, view.shape[0], view.shape[1], comps, view.itemsize, view.strides[0]};
    said m = {{0}, 0};
    const char *failed;
    Py_BEGIN_ALLOW_THREADS
    failed = decode_into(&src, jp2, x0, y0, x1, y1, &t, &m);
    Py_END_ALLOW_THREADS
    if (failed != NULL) {
        PyObject *err = Py_BuildValue("(ss)", failed, m.len ? m.text : "no message");
        if (err != NULL) {
            PyErr_SetObject(Failed, err);
            Py_DECREF(err);
        }
        goto out;
    }
    Py_INCREF(Py_None);
    result = Py_None;
out:
    PyBuffer_Release(&view);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"load", py_load, METH_VARARGS, "Open libopenjp2 at this path (once); its version."},
    {"decode_area", py_decode_area, METH_VARARGS, "An area of a JPEG 2000 image into out, the GIL given up once."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_openjpeg", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__openjpeg(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Failed = PyErr_NewException("ingest.decode._openjpeg.Failed", NULL, NULL);
    if (Failed == NULL || PyModule_AddObject(m, "Failed", Py_NewRef(Failed)) < 0) {
        Py_XDECREF(Failed);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
