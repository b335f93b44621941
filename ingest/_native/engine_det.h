/* Detection on the native engine (included by engine.c, after its types and helpers): each batch's boxes through
 * the plan and its ragged outputs.
 *
 * Python says once where the boxes come from (set_detection, before the first epoch), with the per-box fields
 * (values of 4 or 8 bytes each and their pad value), the int64 per-sample fields, the asked box format, whether
 * boxes are relative, the boxes a sample may have (`most`) and the output rows' stride:
 *
 *   a table  every sample's boxes as one array of absolute ltrb in pixels of its image (the reader's format
 *            converted, `engine/boxes.py` `_to_ltrb`), the samples' offsets into it, the fields' values and each
 *            image's declared size (a probed size that differs leaves the sample to Python, whose reader names the
 *            mismatch): COCO's annotations, known before any image is read;
 *   records  the keys of each record's Object Detection API features (a "tfrecord" table): the four normalized
 *            coordinate lists, image/height and image/width, each per-box field's list and each per-sample field
 *            (an int64, or a decimal id as one bytes value), which det_gather scans out of the record just read
 *            (example_scan.h) and converts as the TFRecord reader does (det_record_box). A record the scan does not
 *            take, whose lists differ in length from its boxes, whose size is not positive or whose id is not a
 *            decimal int64 falls back (WHY_RECORD: the Python reader reads it or names its problem); one with more
 *            boxes than `most` too (WHY_BOXES: the slots' target buffers hold `most` per sample).
 *
 * Per batch:
 *
 *   gather   after the read and parse (det_gather), each sample's boxes and fields into the job's store, from the
 *            table or from its record: one path for both from here on.
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


static int alive(Engine *e);
static int64_t *copy_int64s(PyObject *obj, int64_t count, int64_t *got, const char *name);

/* Sample k's boxes and fields from the table; WHY_PLAN where its probed size is not its declared one. */
static int det_table(Engine *e, Job *j, int64_t k) {
    Det *d = &e->det;
    DetJob *dj = &j->det;
    int64_t i = j->index[k], lo = d->starts[i], count = d->starts[i + 1] - lo;
    if (d->declared != NULL && (j->hw[2 * k] != d->declared[2 * i] || j->hw[2 * k + 1] != d->declared[2 * i + 1]))
        return WHY_PLAN;
    memcpy(dj->sbox + 4 * k * d->most, d->boxes + 4 * lo, (size_t)count * 4 * sizeof(double));
    for (int f = 0; f < d->nfields; ++f)
        memcpy(dj->sfv[f] + (size_t)(k * d->most * d->fsize[f]), d->fvals[f] + (size_t)(lo * d->fsize[f]),
               (size_t)(count * d->fsize[f]));
    for (int v = 0; v < d->nsample; ++v)
        dj->ssv[v][k] = d->svals[v][i];
    dj->scount[k] = count;
    return 0;
}

/* Sample k's boxes and fields scanned out of its record (the job's read arena; record_parse.h's det_scan_record);
 * 0, or why it falls back. */
static int det_record(Engine *e, Job *j, int64_t k) {
    Det *d = &e->det;
    DetJob *dj = &j->det;
    const det_spec spec = {&d->rq, d->rkinds, d->nfields, d->nsample, d->format, d->fsize, d->most};
    unsigned char *fields[DET_FIELDS];
    int64_t values[DET_FIELDS], count;
    for (int f = 0; f < d->nfields; ++f)
        fields[f] = dj->sfv[f] + (size_t)(k * d->most * d->fsize[f]);
    int why = det_scan_record(&spec, j->host + j->off[k], j->got[k], dj->side, dj->sbox + 4 * k * d->most, fields,
                              values, &count);
    if (why != DET_SCAN_OK)
        return why == DET_SCAN_BOXES ? WHY_BOXES : WHY_RECORD;
    for (int v = 0; v < d->nsample; ++v)
        dj->ssv[v][k] = values[v];
    dj->scount[k] = count;
    return 0;
}

/* After the batch's read and parse: every sample the GPU path takes gets its boxes and fields in the job's store
 * (from the table or its record); one that cannot falls back with the reason (see the top). */
static void det_gather(Engine *e, Job *j) {
    if (!e->det.on)
        return;
    DetJob *dj = &j->det;
    for (int64_t k = 0; k < j->n; ++k) {
        dj->scount[k] = 0;
        for (int v = 0; v < e->det.nsample; ++v)
            dj->ssv[v][k] = 0;
        if (j->state[k] != ST_OK)
            continue;
        int why = e->det.record ? det_record(e, j, k) : det_table(e, j, k);
        if (why) {
            dj->scount[k] = 0;
            j->state[k] = ST_FALLBACK;
            j->why[k] = why;
        }
    }
}

/* The m planned samples' boxes (ok_pos) as ing_plan takes them; NULL without detection. */
static ing_boxes *det_boxes(Engine *e, Job *j, int64_t m) {
    if (!e->det.on)
        return NULL;
    DetJob *dj = &j->det;
    int64_t at = 0;
    for (int64_t q = 0; q < m; ++q) {
        int64_t k = j->ok_pos[q], lo = k * e->det.most, count = dj->scount[k];
        memcpy(dj->in + 4 * at, dj->sbox + 4 * lo, (size_t)count * 4 * sizeof(double));
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
                memcpy(to, c < count ? dj->sfv[f] + (size_t)dj->grow[dj->kept[first + c]] * z : d->fpad[f], z);
            }
        }
        for (int f = 0; f <= d->nfields; ++f)
            ((int64_t *)(host + off[1 + d->nfields + f]))[r] = count;
        sizes[2 * r] = row[2];
        sizes[2 * r + 1] = row[3];
        for (int v = 0; v < d->nsample; ++v)
            ((int64_t *)(host + off[1 + 2 * d->nfields + 2 + v]))[r] = dj->ssv[v][k];
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
        free(e->jobs[k].det.in); /* (the job's one block: see set_detection) */
        memset(&e->jobs[k].det, 0, sizeof(DetJob));
    }
    free(d->boxes);
    free(d->starts);
    free(d->declared);
    free(d->rkey_block);
    for (int f = 0; f < DET_FIELDS; ++f) {
        free(d->fvals[f]);
        free(d->svals[f]);
        d->fvals[f] = NULL;
        d->svals[f] = NULL;
    }
    d->boxes = NULL;
    d->starts = d->declared = NULL;
    d->rkey_block = NULL;
    d->record = 0;
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

/* A record source's keys and scan codes (set_detection's `record`): DET_RKEYS box keys ("FFFFii"), then one 'I' or
 * 'F' per per-box field (its values 8 or 4 bytes), then one 'i' or 'b' (a decimal id) per per-sample field. 0 with
 * an exception set. */
static int det_set_record(Det *d, PyObject *record) {
    PyObject *keys, *kinds;
    if (!PyArg_ParseTuple(record, "OS:a record's keys", &keys, &kinds))
        return 0;
    Py_ssize_t m = PyList_Check(keys) ? PyList_GET_SIZE(keys) : -1, total = 0;
    const char *code = PyBytes_AS_STRING(kinds);
    int ok = m == DET_RKEYS + d->nfields + d->nsample && PyBytes_GET_SIZE(kinds) == m && m <= EX_MAX_KEYS &&
             memcmp(code, "FFFFii", DET_RKEYS) == 0;
    for (Py_ssize_t k = 0; ok && k < m; ++k) {
        ok = PyBytes_Check(PyList_GET_ITEM(keys, k));
        if (ok && k >= DET_RKEYS && k < DET_RKEYS + d->nfields)
            ok = (code[k] == 'I' && d->fsize[k - DET_RKEYS] == 8) || (code[k] == 'F' && d->fsize[k - DET_RKEYS] == 4);
        else if (ok && k >= DET_RKEYS)
            ok = code[k] == 'i' || code[k] == 'b';
        if (ok)
            total += PyBytes_GET_SIZE(PyList_GET_ITEM(keys, k));
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "set_detection: a record's keys are a list of bytes, the box keys' codes "
                                          "'FFFFii', then 'I' (8 bytes) or 'F' (4) per box field, 'i' or 'b' per "
                                          "sample field");
        return 0;
    }
    if ((d->rkey_block = malloc((size_t)total + 1)) == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    char *at = d->rkey_block;
    for (Py_ssize_t k = 0; k < m; ++k) {
        PyObject *key = PyList_GET_ITEM(keys, k);
        memcpy(at, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key));
        d->rq.keys[k] = at;
        d->rq.lens[k] = PyBytes_GET_SIZE(key);
        at += PyBytes_GET_SIZE(key);
    }
    memcpy(d->rkinds, code, (size_t)m);
    d->rkinds[m] = 0;
    d->rq.m = m;
    d->rq.kinds = d->rkinds;
    d->record = 1;
    return 1;
}

/* set_detection(boxes, starts, fields, samples, format, relative, declared, stride, batchwide, record, most): where
 * the boxes come from (see the top). A table: boxes, starts, declared (or None) and each field's values; records
 * (`record`: (keys, codes), "tfrecord" tables only): those None, and `most` the boxes a sample may have. */
static PyObject *Engine_set_detection(Engine *e, PyObject *args) {
    PyObject *boxes, *starts, *fields, *samples, *declared, *record = Py_None;
    int format, relative, batchwide;
    long long stride, most = 0;
    if (!PyArg_ParseTuple(args, "OOOOipOLp|OL:set_detection", &boxes, &starts, &fields, &samples, &format,
                          &relative, &declared, &stride, &batchwide, &record, &most) ||
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
    int records = record != Py_None;
    if (!PyList_Check(fields) || !PyList_Check(samples) || PyList_GET_SIZE(fields) > DET_FIELDS ||
        PyList_GET_SIZE(samples) > DET_FIELDS || format < DET_XYXY || format > DET_CXCYWH || stride < 1 ||
        (records && (e->format != FMT_TFRECORD || most < 1 || relative))) {
        PyErr_Format(PyExc_ValueError, "set_detection: at most %d fields of each kind (lists), a box format 0..2, "
                                       "a stride >= 1; records from a TFRecord table, absolute, most >= 1",
                     DET_FIELDS);
        return NULL;
    }
    int64_t n = e->n;
    d->nfields = (int)PyList_GET_SIZE(fields);
    d->nsample = (int)PyList_GET_SIZE(samples);
    if (!records) {
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
        most = 0;
        for (int64_t i = 0; i < n; ++i)
            if (d->starts[i + 1] - d->starts[i] > most)
                most = d->starts[i + 1] - d->starts[i];
    }
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
        if (!records && (d->fvals[f] = det_copy(values, d->nbox, size, "a box field")) == NULL)
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
    for (int v = 0; v < d->nsample && !records; ++v)
        if ((d->svals[v] = copy_int64s(PyList_GET_ITEM(samples, v), n, NULL, "a sample field")) == NULL)
            goto bad;
    if (records && !det_set_record(d, record))
        goto bad;
    d->most = most;
    /* one block per job: in, out (4 M doubles each), the store's boxes, then int64s, then the store's fields */
    int64_t M = e->batch * most + 1, B = e->batch, S = most * (4 + d->nfields) + 1, words = 8 * M + 4 * B * most;
    words += 2 * M + 6 * B + 1 + d->nsample * B + S;
    for (int f = 0; f < d->nfields; ++f)
        words += (B * most * d->fsize[f] + 7) / 8;
    for (int k = 0; k < JOBS; ++k) {
        DetJob *dj = &e->jobs[k].det;
        double *block = calloc((size_t)words, 8);
        if (block == NULL) {
            PyErr_NoMemory();
            goto bad;
        }
        dj->in = block;
        dj->out = block + 4 * M;
        dj->sbox = block + 8 * M;
        int64_t *p = (int64_t *)(dj->sbox + 4 * B * most);
        dj->grow = p, p += M;
        dj->kept = p, p += M;
        dj->counts = p, p += B;
        dj->kept_counts = p, p += B;
        dj->first = p, p += B + 1;
        dj->q_of = p, p += B;
        dj->scount = p, p += B;
        for (int v = 0; v < d->nsample; ++v)
            dj->ssv[v] = p, p += B;
        dj->side = p, p += S;
        for (int f = 0; f < d->nfields; ++f) {
            dj->sfv[f] = (unsigned char *)p;
            p += (B * most * d->fsize[f] + 7) / 8;
        }
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
