/* Detection on the native engine (included by engine.c, after its types and helpers): each batch's boxes through
 * the plan and its ragged outputs.
 *
 * Python hands the dataset's boxes over once (set_detection, before the first epoch): every sample's boxes as one
 * array of absolute ltrb in pixels of its image (the reader's format converted, `engine/boxes.py` `_to_ltrb`), the
 * samples' offsets into it, the per-box fields (values of 4 or 8 bytes each and their pad value), int64 per-sample
 * fields, the asked box format and whether boxes are relative, each image's declared size (a probed size that
 * differs leaves the sample to Python, whose reader names the mismatch) and the output rows' stride. Per batch:
 *
 *   prepare  the planned samples' boxes into an ing_boxes (det_boxes) given to ing_plan, which draws RandomIoUCrop
 *            on them and returns the kept boxes in output pixels with their rows (det_planned indexes them). Every
 *            sample has its own output size; a sample whose output would not fit a row (stride) falls back.
 *   output   the kernel writes row r at r * row_elems: the fixed stride (each image dense at its own size, the
 *            rest of the row unused), or with a batch-wide PadTo the batch's one size (the rows one dense tensor).
 *            det_rows stages the targets in the slot's host buffer, padded to the batch's most kept boxes K as the
 *            Python engine collates them: boxes float32 [rows, K, 4] in the asked format (`boxes.from_ltrb`), each
 *            per-box field [rows, K] gathered by the kept rows (pad values after each row's count), the counts as
 *            int64 [rows] once per box field (boxes first), image_sizes int64 [rows, 2] (the size before the
 *            trailing PadTo) and each per-sample field int64 [rows]; each section 8-byte aligned. det_upload
 *            copies them to the slot's device buffer behind the batch's kernel, in the same stream.
 *
 * The slot's info array tells Python where things are: [0] K, [1] rows, [2] bytes staged, [3] sections, [4..]
 * each section's byte offset; from DET_HEAD, per row: out height, width, content height, width, kept boxes (zeros
 * for a row Python fills: a fallback). */

enum { DET_XYXY = 0, DET_XYWH = 1, DET_CXCYWH = 2 };

static int alive(Engine *e);
static int64_t *copy_int64s(PyObject *obj, int64_t count, int64_t *got, const char *name);

/* A sample whose probed size is not its declared one falls back (Python's reader names it). */
static void det_check(Engine *e, Job *j) {
    if (!e->det.on || e->det.declared == NULL)
        return;
    for (int64_t k = 0; k < j->n; ++k) {
        const int64_t *want = e->det.declared + 2 * j->index[k];
        if (j->state[k] == ST_OK && (j->hw[2 * k] != want[0] || j->hw[2 * k + 1] != want[1])) {
            j->state[k] = ST_FALLBACK;
            j->why[k] = WHY_PLAN;
        }
    }
}

/* The m planned samples' boxes (ok_index) as ing_plan takes them; NULL without detection. */
static ing_boxes *det_boxes(Engine *e, Job *j, int64_t m) {
    if (!e->det.on)
        return NULL;
    DetJob *dj = &j->det;
    int64_t at = 0;
    for (int64_t q = 0; q < m; ++q) {
        int64_t i = j->ok_index[q], lo = e->det.starts[i], count = e->det.starts[i + 1] - lo;
        memcpy(dj->in + 4 * at, e->det.boxes + 4 * lo, (size_t)count * 4 * sizeof(double));
        for (int64_t c = 0; c < count; ++c)
            dj->grow[at + c] = lo + c;
        dj->counts[q] = count;
        at += count;
    }
    dj->boxes = (ing_boxes){.in = dj->in, .counts = dj->counts, .min_size = 0.0, .out = dj->out, .kept = dj->kept,
                            .kept_counts = dj->kept_counts};
    return &dj->boxes;
}

/* After ing_plan: each sample's planned index, each planned sample's first kept box, the rows' stride. */
static void det_planned(Engine *e, Job *j, int64_t m) {
    if (!e->det.on)
        return;
    DetJob *dj = &j->det;
    for (int64_t k = 0; k < j->n; ++k)
        dj->q_of[k] = -1;
    dj->first[0] = 0;
    for (int64_t q = 0; q < m; ++q) {
        dj->q_of[j->ok_pos[q]] = q;
        dj->first[q + 1] = dj->first[q] + dj->kept_counts[q];
    }
    dj->row_elems = e->det.stride;
    if (e->det.batchwide && m > 0)
        dj->row_elems = j->ok_plan[0].out_hw[0] * j->ok_plan[0].out_hw[1] * e->chain.channels;
}

/* Whether a planned sample's output does not fit its row. */
static int det_too_big(const Engine *e, const ing_sample *s) {
    return s->out_hw[0] * s->out_hw[1] * e->chain.channels > e->det.stride;
}

/* One kept box (ltrb in output pixels) in the asked format, float32 (`boxes.from_ltrb`). */
static void det_convert(const Det *d, const double *b, const ing_sample *s, float *to) {
    double v[4] = {b[0], b[1], b[2], b[3]};
    if (d->format == DET_XYWH) {
        v[2] -= v[0];
        v[3] -= v[1];
    } else if (d->format == DET_CXCYWH) {
        v[2] -= v[0];
        v[3] -= v[1];
        v[0] += v[2] / 2;
        v[1] += v[3] / 2;
    }
    if (d->relative) {
        double w = (double)s->out_hw[1], h = (double)s->out_hw[0];
        v[0] /= w;
        v[1] /= h;
        v[2] /= w;
        v[3] /= h;
    }
    for (int c = 0; c < 4; ++c)
        to[c] = (float)v[c];
}

/* Stages the batch's targets in the slot's host buffer (see the top). 0 after fail(). */
static int det_rows(Engine *e, Job *j, int slot, int64_t rows) {
    Det *d = &e->det;
    if (!d->on)
        return 1;
    DetJob *dj = &j->det;
    pthread_mutex_lock(&e->lock); /* (set_targets may have replaced them while the slot was out) */
    unsigned char *host = d->theld[2 * slot] ? d->thost[slot].buf : NULL;
    size_t cap = host ? (size_t)d->thost[slot].len : 0;
    int64_t *info = d->theld[2 * slot + 1] ? d->tinfo[slot].buf : NULL;
    pthread_mutex_unlock(&e->lock);
    d->tbytes[slot] = 0;
    if (host == NULL || info == NULL)
        return 1;
    int64_t K = 0;
    for (int64_t k = 0; k < j->n; ++k)
        if (j->state[k] == ST_OK && dj->kept_counts[dj->q_of[k]] > K)
            K = dj->kept_counts[dj->q_of[k]];
    int64_t off[3 + 3 * DET_FIELDS];
    int ns = 0;
    size_t at = 0;
#define DET_SECTION(bytes) (off[ns++] = (int64_t)at, at += ((size_t)(bytes) + 7) / 8 * 8)
    DET_SECTION(rows * K * 16);
    for (int f = 0; f < d->nfields; ++f)
        DET_SECTION(rows * K * d->fsize[f]);
    for (int f = 0; f <= d->nfields; ++f)
        DET_SECTION(rows * 8);
    DET_SECTION(rows * 16);
    for (int s = 0; s < d->nsample; ++s)
        DET_SECTION(rows * 8);
#undef DET_SECTION
    if (at > cap) {
        fail(e, "batch %lld of epoch %lld: its boxes need %zu bytes, the slot's target buffer holds %zu",
             (long long)j->number, (long long)j->epoch, at, cap);
        return 0;
    }
    info[0] = K;
    info[1] = rows;
    info[2] = (int64_t)at;
    info[3] = ns;
    for (int q = 0; q < ns; ++q)
        info[4 + q] = off[q];
    float *boxes = (float *)(host + off[0]);
    int64_t *sizes = (int64_t *)(host + off[1 + 2 * d->nfields + 1]);
    for (int64_t k = 0; k < j->n; ++k) {
        int64_t r = e->g_row[k];
        if (r < 0)
            continue;
        int64_t *row = info + DET_HEAD + 5 * r, q = j->state[k] == ST_OK ? dj->q_of[k] : -1;
        int64_t count = q >= 0 ? dj->kept_counts[q] : 0, first = q >= 0 ? dj->first[q] : 0;
        const ing_sample *s = &j->plan[k];
        row[0] = q >= 0 ? s->out_hw[0] : 0;
        row[1] = q >= 0 ? s->out_hw[1] : 0;
        row[2] = q >= 0 ? s->content_hw[0] : 0;
        row[3] = q >= 0 ? s->content_hw[1] : 0;
        row[4] = count;
        for (int64_t c = 0; c < K; ++c) {
            float *b = boxes + 4 * (r * K + c);
            if (c < count)
                det_convert(d, dj->out + 4 * (first + c), s, b);
            else
                b[0] = b[1] = b[2] = b[3] = 0.0f;
            for (int f = 0; f < d->nfields; ++f) {
                size_t z = (size_t)d->fsize[f];
                unsigned char *to = host + off[1 + f] + (size_t)(r * K + c) * z;
                memcpy(to, c < count ? d->fvals[f] + (size_t)dj->grow[dj->kept[first + c]] * z : d->fpad[f], z);
            }
        }
        for (int f = 0; f <= d->nfields; ++f)
            ((int64_t *)(host + off[1 + d->nfields + f]))[r] = count;
        sizes[2 * r] = row[2];
        sizes[2 * r + 1] = row[3];
        for (int v = 0; v < d->nsample; ++v)
            ((int64_t *)(host + off[1 + 2 * d->nfields + 2 + v]))[r] = d->svals[v][j->index[k]];
    }
    d->tbytes[slot] = at;
    return 1;
}

/* The staged targets to the slot's device buffer, on the engine's stream (behind the consumer's wait). */
static int det_upload(Engine *e, int slot) {
    Det *d = &e->det;
    if (!d->on || !e->gpu || d->tbytes[slot] == 0 || d->tdev[slot] == 0 || !d->theld[2 * slot])
        return 1;
    return cuok(e, cu.MemcpyHtoDAsync(d->tdev[slot], d->thost[slot].buf, d->tbytes[slot], e->stream),
                "cuMemcpyHtoDAsync (boxes)");
}

static void det_free(Engine *e) {
    Det *d = &e->det;
    for (int k = 0; k < JOBS; ++k) {
        free(e->jobs[k].det.in);
        memset(&e->jobs[k].det, 0, sizeof(DetJob));
    }
    free(d->boxes);
    free(d->starts);
    free(d->declared);
    for (int f = 0; f < DET_FIELDS; ++f) {
        free(d->fvals[f]);
        free(d->svals[f]);
        d->fvals[f] = NULL;
        d->svals[f] = NULL;
    }
    d->boxes = NULL;
    d->starts = d->declared = NULL;
    d->on = 0;
}

/* (GIL held) */
static void det_release(Engine *e) {
    Det *d = &e->det;
    for (int64_t s = 0; d->theld && s < e->nslots; ++s) {
        if (d->theld[2 * s])
            PyBuffer_Release(&d->thost[s]);
        if (d->theld[2 * s + 1])
            PyBuffer_Release(&d->tinfo[s]);
    }
    free(d->theld);
    free(d->thost);
    free(d->tinfo);
    free(d->tdev);
    free(d->tbytes);
    d->theld = NULL;
    d->thost = d->tinfo = NULL;
    d->tdev = NULL;
    d->tbytes = NULL;
}

/* A bytes-like of `count` items of `size` bytes, copied; NULL with an exception set. */
static unsigned char *det_copy(PyObject *obj, int64_t count, int64_t size, const char *name) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    unsigned char *out = NULL;
    if (v.len != count * size)
        PyErr_Format(PyExc_ValueError, "set_detection: %s holds %zd bytes, %lld needed", name, v.len,
                     (long long)(count * size));
    else if ((out = malloc(v.len ? (size_t)v.len : 8)) == NULL)
        PyErr_NoMemory();
    else
        memcpy(out, v.buf, (size_t)v.len);
    PyBuffer_Release(&v);
    return out;
}

static PyObject *Engine_set_detection(Engine *e, PyObject *args) {
    PyObject *boxes, *starts, *fields, *samples, *declared;
    int format, relative, batchwide;
    long long stride;
    if (!PyArg_ParseTuple(args, "OOOOipOLp:set_detection", &boxes, &starts, &fields, &samples, &format, &relative,
                          &declared, &stride, &batchwide) ||
        !alive(e))
        return NULL;
    Det *d = &e->det;
    pthread_mutex_lock(&e->lock);
    int early = e->epochs == NULL && e->batches_decoded == 0 && e->st_batches == 0;
    pthread_mutex_unlock(&e->lock);
    if (d->on || !early) {
        PyErr_SetString(PyExc_RuntimeError, "set_detection: once, before the first epoch is added");
        return NULL;
    }
    if (!PyList_Check(fields) || !PyList_Check(samples) || PyList_GET_SIZE(fields) > DET_FIELDS ||
        PyList_GET_SIZE(samples) > DET_FIELDS || format < DET_XYXY || format > DET_CXCYWH || stride < 1) {
        PyErr_Format(PyExc_ValueError, "set_detection: at most %d fields of each kind (lists), a box format 0..2 and "
                                       "a stride >= 1", DET_FIELDS);
        return NULL;
    }
    int64_t n = e->n, ns = 0;
    if ((d->starts = copy_int64s(starts, n + 1, NULL, "starts")) == NULL)
        goto bad;
    for (int64_t i = 0; i < n; ++i)
        if (d->starts[i + 1] < d->starts[i] || d->starts[0] != 0) {
            PyErr_SetString(PyExc_ValueError, "set_detection: starts must rise from 0");
            goto bad;
        }
    d->nbox = d->starts[n];
    if ((d->boxes = (double *)det_copy(boxes, d->nbox * 4, 8, "boxes")) == NULL)
        goto bad;
    if (declared != Py_None && (d->declared = copy_int64s(declared, 2 * n, NULL, "declared")) == NULL)
        goto bad;
    d->nfields = (int)PyList_GET_SIZE(fields);
    for (int f = 0; f < d->nfields; ++f) {
        PyObject *values, *pad;
        Py_ssize_t size;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(fields, f), "OnO:a box field", &values, &size, &pad))
            goto bad;
        Py_buffer p;
        if (size != 4 && size != 8) {
            PyErr_SetString(PyExc_ValueError, "set_detection: a box field's values are 4 or 8 bytes");
            goto bad;
        }
        d->fsize[f] = size;
        if ((d->fvals[f] = det_copy(values, d->nbox, size, "a box field")) == NULL)
            goto bad;
        if (PyObject_GetBuffer(pad, &p, PyBUF_C_CONTIGUOUS) < 0)
            goto bad;
        int ok = p.len == size;
        if (ok)
            memcpy(d->fpad[f], p.buf, (size_t)size);
        PyBuffer_Release(&p);
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "set_detection: a box field's pad is one value of its size");
            goto bad;
        }
    }
    d->nsample = (int)PyList_GET_SIZE(samples);
    for (int v = 0; v < d->nsample; ++v)
        if ((d->svals[v] = copy_int64s(PyList_GET_ITEM(samples, v), n, NULL, "a sample field")) == NULL)
            goto bad;
    d->maxcount = 0;
    for (int64_t i = 0; i < n; ++i)
        if (d->starts[i + 1] - d->starts[i] > d->maxcount)
            d->maxcount = d->starts[i + 1] - d->starts[i];
    int64_t M = e->batch * d->maxcount + 1, B = e->batch;
    for (int k = 0; k < JOBS; ++k) { /* one block per job: in, out (4 M doubles each), then int64s */
        DetJob *dj = &e->jobs[k].det;
        double *block = calloc((size_t)(8 * M + 2 * M + 4 * B + 1), 8);
        if (block == NULL) {
            PyErr_NoMemory();
            goto bad;
        }
        dj->in = block;
        dj->out = block + 4 * M;
        int64_t *p = (int64_t *)(block + 8 * M);
        dj->grow = p, p += M;
        dj->kept = p, p += M;
        dj->counts = p, p += B;
        dj->kept_counts = p, p += B;
        dj->first = p, p += B + 1;
        dj->q_of = p;
    }
    d->theld = calloc((size_t)e->nslots * 2, 1);
    d->thost = calloc((size_t)e->nslots, sizeof(Py_buffer));
    d->tinfo = calloc((size_t)e->nslots, sizeof(Py_buffer));
    d->tdev = calloc((size_t)e->nslots, sizeof(CUdeviceptr));
    d->tbytes = calloc((size_t)e->nslots, sizeof(size_t));
    if (!d->theld || !d->thost || !d->tinfo || !d->tdev || !d->tbytes) {
        PyErr_NoMemory();
        goto bad;
    }
    d->format = format;
    d->relative = relative;
    d->batchwide = batchwide;
    d->stride = stride;
    (void)ns;
    pthread_mutex_lock(&e->lock); /* (the engine's threads read it after the first add_epoch, under this lock) */
    d->on = 1;
    pthread_mutex_unlock(&e->lock);
    Py_RETURN_NONE;
bad:
    det_free(e);
    det_release(e);
    return NULL;
}

/* set_targets(k, device address, host buffer, info): slot k's target buffers (see the top). */
static PyObject *Engine_set_targets(Engine *e, PyObject *args) {
    Py_ssize_t slot;
    unsigned long long dev;
    PyObject *host, *info;
    if (!PyArg_ParseTuple(args, "nKOO:set_targets", &slot, &dev, &host, &info) || !alive(e))
        return NULL;
    Det *d = &e->det;
    if (!d->on || slot < 0 || slot >= e->nslots) {
        PyErr_Format(PyExc_ValueError, "set_targets: slot %zd of an engine given set_detection", slot);
        return NULL;
    }
    Py_buffer h, v;
    if (PyObject_GetBuffer(host, &h, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(info, &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&h);
        return NULL;
    }
    if (v.len < (Py_ssize_t)((DET_HEAD + 5 * e->batch) * 8)) {
        PyErr_Format(PyExc_ValueError, "set_targets: the info array holds %zd bytes, %lld needed", v.len,
                     (long long)((DET_HEAD + 5 * e->batch) * 8));
        PyBuffer_Release(&h);
        PyBuffer_Release(&v);
        return NULL;
    }
    pthread_mutex_lock(&e->lock);
    Py_buffer oh = d->thost[slot], ov = d->tinfo[slot];
    int had = d->theld[2 * slot];
    d->thost[slot] = h;
    d->tinfo[slot] = v;
    d->theld[2 * slot] = d->theld[2 * slot + 1] = 1;
    d->tdev[slot] = (CUdeviceptr)dev;
    pthread_mutex_unlock(&e->lock);
    if (had) {
        PyBuffer_Release(&oh);
        PyBuffer_Release(&ov);
    }
    Py_RETURN_NONE;
}
