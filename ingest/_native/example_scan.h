/* The protobuf wire-format scan of tf.train.Example (and the varint and field walk that Caffe's Datum needs), in
 * pure C: no Python object, no allocation, safe on any thread. ingest/formats/_wire.c (a batch of records for the
 * Python reader) and ingest/_native/engine.c (the native engine's TFRecord and Caffe Datum records) share it.
 *
 * Protobuf's wire format: a message is fields, each a varint tag (field number << 3 | wire type) and a value:
 * wire type 0 a varint, 1 eight bytes, 2 a varint length and that many bytes, 5 four bytes. The messages
 * (tensorflow/core/example/{example,feature}.proto, proto3):
 *     Example { Features features = 1; }      SequenceExample { Features context = 1; FeatureLists ... = 2; }
 *     Features { map<string, Feature> feature = 1; }   a map entry: { string key = 1; Feature value = 2; }
 *     Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
 *     BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1 [packed]; }
 *     Int64List { repeated int64 value = 1 [packed]; }
 * An Example is taken (EX_OK) when every message parses, nothing is given twice where protobuf would merge or
 * override (Example.features, a map entry's key or value, a Feature's list, a requested key), every map key is
 * UTF-8 (proto3 strings) and every requested feature holds what its kind asks for. Unknown fields of wire types
 * 0, 1, 2 and 5 are skipped, as protobuf does, but in a map entry (protobuf sets such an entry aside: its key is
 * then missing); those, groups, a known field of another wire type or anything malformed give EX_BAIL: the
 * caller's protobuf path reads the record or names what is wrong with it.
 *
 * Requested keys and their kind codes: 'b' one bytes value, 'i' one int64, 'f' one float, 'I' an int64 list,
 * 'F' a float list. Per key two int64 cells: b: offset from `base`, length; i: the value, 0; f: the value as
 * float64 bits, 0; I, F: where the values start in the side buffer, their count (F: float64 bits).
 */
#ifndef INGEST_EXAMPLE_SCAN_H
#define INGEST_EXAMPLE_SCAN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define EX_MAX_KEYS 64
enum { EX_OK = 0, EX_BAIL = 1 };

typedef struct {
    const unsigned char *p, *end;
} ex_span;

typedef struct {
    int64_t *side;
    int64_t cap, used;
} ex_side;

typedef struct {
    int64_t m;
    const char *keys[EX_MAX_KEYS];
    int64_t lens[EX_MAX_KEYS];
    const char *kinds;
} ex_request;

static int ex_varint(ex_span *s, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (s->p >= s->end)
            return EX_BAIL;
        unsigned char b = *s->p++;
        if (shift == 63 && b > 1)
            return EX_BAIL; /* more than 64 bits */
        x |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return EX_OK;
        }
    }
    return EX_BAIL;
}

/* The next field's number, wire type and value: `x` for wire type 0, the bytes in `value` for the others. */
static int ex_next_field(ex_span *s, uint32_t *number, int *wire, ex_span *value, uint64_t *x) {
    uint64_t tag;
    if (ex_varint(s, &tag) != EX_OK || (tag >> 3) == 0 || (tag >> 3) > 0x1FFFFFFF)
        return EX_BAIL;
    *number = (uint32_t)(tag >> 3);
    *wire = (int)(tag & 7);
    uint64_t len;
    switch (*wire) {
    case 0:
        return ex_varint(s, x);
    case 1:
    case 5: {
        ptrdiff_t size = *wire == 1 ? 8 : 4;
        if (s->end - s->p < size)
            return EX_BAIL;
        value->p = s->p;
        s->p += size;
        value->end = s->p;
        return EX_OK;
    }
    case 2:
        if (ex_varint(s, &len) != EX_OK || len > (uint64_t)(s->end - s->p))
            return EX_BAIL;
        value->p = s->p;
        value->end = s->p + len;
        s->p = value->end;
        return EX_OK;
    default: /* groups (3, 4), invalid (6, 7) */
        return EX_BAIL;
    }
}

/* Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF), as protobuf checks proto3 strings. */
static int ex_utf8(const unsigned char *p, const unsigned char *end) {
    while (p < end) {
        unsigned char c = *p++;
        if (c < 0x80)
            continue;
        int more;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF)
            more = 1, cp = c & 0x1F, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF)
            more = 2, cp = c & 0x0F, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4)
            more = 3, cp = c & 0x07, min = 0x10000;
        else
            return EX_BAIL;
        if (end - p < more)
            return EX_BAIL;
        for (int k = 0; k < more; k++) {
            if ((p[k] & 0xC0) != 0x80)
                return EX_BAIL;
            cp = cp << 6 | (p[k] & 0x3F);
        }
        p += more;
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return EX_BAIL;
    }
    return EX_OK;
}

static int ex_side_put(ex_side *sb, int64_t v) {
    if (sb->used >= sb->cap)
        return EX_BAIL;
    sb->side[sb->used++] = v;
    return EX_OK;
}

static int64_t ex_float_bits(const unsigned char *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, 4);
    double d = f;
    int64_t bits;
    memcpy(&bits, &d, 8);
    return bits;
}

/* One list message (a Feature's bytes_list 1, float_list 2 or int64_list 3): every value checked; with `want`
 * (the kind code of a requested key, 0 for none) its values go to `cell` (two int64) and, for lists, `sb`. */
static int ex_scan_list(ex_span s, uint32_t list, char want, const unsigned char *base, int64_t *cell, ex_side *sb) {
    int64_t count = 0;
    int64_t start = sb->used;
    ex_span v;
    uint32_t number;
    int wire;
    uint64_t x;
    while (s.p < s.end) {
        if (ex_next_field(&s, &number, &wire, &v, &x) != EX_OK)
            return EX_BAIL;
        if (number != 1)
            continue; /* an unknown field */
        if (list == 1) { /* bytes */
            if (wire != 2)
                return EX_BAIL;
            if (want == 'b' && count == 0) {
                cell[0] = v.p - base;
                cell[1] = v.end - v.p;
            }
            count++;
        } else if (list == 2) { /* float: packed (2) or one value (5) */
            if ((wire != 2 && wire != 5) || (v.end - v.p) % 4)
                return EX_BAIL;
            for (const unsigned char *q = v.p; q < v.end; q += 4, count++) {
                if (want == 'f' && count == 0)
                    cell[0] = ex_float_bits(q);
                else if (want == 'F' && ex_side_put(sb, ex_float_bits(q)) != EX_OK)
                    return EX_BAIL;
            }
        } else { /* int64: packed (2) or one value (0) */
            if (wire != 0 && wire != 2)
                return EX_BAIL;
            int packed = wire == 2;
            while (!packed || v.p < v.end) {
                if (packed && ex_varint(&v, &x) != EX_OK)
                    return EX_BAIL;
                if (want == 'i' && count == 0)
                    cell[0] = (int64_t)x;
                else if (want == 'I' && ex_side_put(sb, (int64_t)x) != EX_OK)
                    return EX_BAIL;
                count++;
                if (!packed)
                    break;
            }
        }
    }
    if (want == 'I' || want == 'F') {
        cell[0] = start;
        cell[1] = count;
    } else if (want && count != 1) {
        return EX_BAIL; /* a one-value kind: protobuf's path says what is wrong */
    }
    return EX_OK;
}

/* One Feature message; `want` as for ex_scan_list. A Feature with no list holds an empty list of any type. */
static int ex_scan_feature(ex_span s, char want, const unsigned char *base, int64_t *cell, ex_side *sb) {
    ex_span v, list = {NULL, NULL};
    uint32_t number, which = 0;
    int wire;
    uint64_t x;
    while (s.p < s.end) {
        if (ex_next_field(&s, &number, &wire, &v, &x) != EX_OK)
            return EX_BAIL;
        if (number < 1 || number > 3)
            continue;
        if (wire != 2 || which)
            return EX_BAIL; /* a second list: protobuf merges or switches the oneof */
        which = number;
        list = v;
    }
    uint32_t expect = want == 'b' ? 1 : (want == 'f' || want == 'F') ? 2 : (want == 'i' || want == 'I') ? 3 : 0;
    if (!which) {
        if (want == 'I' || want == 'F') {
            cell[0] = sb->used;
            cell[1] = 0;
            return EX_OK;
        }
        return want ? EX_BAIL : EX_OK;
    }
    if (want && which != expect)
        return EX_BAIL;
    return ex_scan_list(list, which, want, base, cell, sb);
}

/* The requested features of the serialized Example in `data` (a TFRecord record's data), two cells per key in
 * `cells`; offsets of bytes values are from `base`. A record that is not canonical gives EX_BAIL (see the top). */
static int ex_scan_example(ex_span data, const ex_request *rq, const unsigned char *base, int64_t *cells,
                           ex_side *sb) {
    ex_span s = data, v, features = {NULL, NULL};
    uint32_t number;
    int wire, seen = 0;
    uint64_t x;
    while (s.p < s.end) { /* Example */
        if (ex_next_field(&s, &number, &wire, &v, &x) != EX_OK)
            return EX_BAIL;
        if (number == 1) {
            if (wire != 2 || seen)
                return EX_BAIL;
            seen = 1;
            features = v;
        } else if (number == 2) {
            return EX_BAIL; /* a SequenceExample's feature lists: protobuf reads (and checks) those */
        }
    }
    int found[EX_MAX_KEYS] = {0};
    int64_t left = rq->m;
    s = features;
    while (s.p && s.p < s.end) { /* Features: map entries */
        if (ex_next_field(&s, &number, &wire, &v, &x) != EX_OK)
            return EX_BAIL;
        if (number != 1)
            continue;
        if (wire != 2)
            return EX_BAIL;
        ex_span e = v, key = {(const unsigned char *)"", (const unsigned char *)""}, value = {NULL, NULL}, f;
        int has_key = 0, has_value = 0;
        while (e.p < e.end) {
            if (ex_next_field(&e, &number, &wire, &f, &x) != EX_OK)
                return EX_BAIL;
            if (number != 1 && number != 2)
                return EX_BAIL; /* an unknown field in a map entry: protobuf sets the whole entry aside */
            if (wire != 2 || (number == 1 ? has_key : has_value))
                return EX_BAIL;
            if (number == 1)
                has_key = 1, key = f;
            else
                has_value = 1, value = f;
        }
        if (ex_utf8(key.p, key.end) != EX_OK)
            return EX_BAIL;
        int64_t klen = key.end - key.p;
        int64_t k = 0;
        while (k < rq->m && !(rq->lens[k] == klen && memcmp(rq->keys[k], key.p, (size_t)klen) == 0))
            k++;
        char want = 0;
        int64_t scratch[2];
        int64_t *cell = scratch;
        if (k < rq->m) {
            if (found[k])
                return EX_BAIL; /* a key given twice: the last one wins in protobuf */
            found[k] = 1;
            left--;
            want = rq->kinds[k];
            cell = cells + 2 * k;
        }
        if (value.p && ex_scan_feature(value, want, base, cell, sb) != EX_OK)
            return EX_BAIL;
        if (!value.p && want && want != 'I' && want != 'F')
            return EX_BAIL;
        if (!value.p && want) {
            cell[0] = sb->used;
            cell[1] = 0;
        }
    }
    return left ? EX_BAIL : EX_OK; /* a requested key missing: protobuf's path names it */
}

/* -- TFRecord framing: uint64 length, masked CRC32C of it, data, masked CRC32C of the data ---------------------- */

#define EX_FRAMING 16

static uint64_t ex_le64(const unsigned char *p) {
    uint64_t x = 0;
    for (int k = 7; k >= 0; k--)
        x = x << 8 | p[k];
    return x;
}

static uint32_t ex_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* TFRecord's mask of a CRC32C. */
static uint32_t ex_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

#endif
