/* CRC32C (Castagnoli), as the crc32c package computes it: ing_crc32c(0, data, n) == crc32c.crc32c(data), and
 * ing_crc32c(ing_crc32c(0, a, n), b, m) is the CRC of a followed by b.
 *
 * Where the CPU has SSE4.2 (x86-64, checked at run time) the crc32 instruction does it 8 bytes a step, on three
 * streams at once over blocks of 3 x 8 KB and then 3 x 256 bytes (the instruction's latency is three times its
 * throughput), the streams joined by shifting a CRC over zeros with tables (Mark Adler's crc32c.c); elsewhere,
 * slicing-by-8 over tables. Only the hardware function is compiled for SSE4.2 (a target attribute), so the
 * extensions build with plain gcc flags. Call ing_crc32c_init() once (with the GIL held, at module init) before
 * any thread computes a CRC; after that every call is thread-safe and touches no Python object.
 */
#ifndef INGEST_CRC32C_H
#define INGEST_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ING_CRC32C_X86 1
#include <nmmintrin.h>
#endif

static uint32_t ing_crc32c_table[8][256];

#ifdef ING_CRC32C_X86
static int ing_crc32c_hw; /* the CPU has SSE4.2 */
#define ING_CRC32C_LONG 8192
#define ING_CRC32C_SHORT 256
/* the register after len zero bytes, as four byte tables (for LONG and SHORT) */
static uint32_t ing_crc32c_long[4][256], ing_crc32c_short[4][256];

static uint32_t ing_gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    for (; vec; vec >>= 1, ++mat)
        if (vec & 1)
            sum ^= *mat;
    return sum;
}

static void ing_gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; ++n)
        square[n] = ing_gf2_times(mat, mat[n]);
}

/* The operator (32 columns) that moves a CRC register over len zero bytes (len >= 1). */
static void ing_crc32c_zeros_op(uint32_t *even, size_t len) {
    uint32_t odd[32], row = 1;
    odd[0] = 0x82F63B78u; /* one zero bit */
    for (int n = 1; n < 32; ++n, row <<= 1)
        odd[n] = row;
    ing_gf2_square(even, odd); /* two zero bits */
    ing_gf2_square(odd, even); /* four: then one byte, two, four ... as len's bits say */
    do {
        ing_gf2_square(even, odd);
        len >>= 1;
        if (len == 0)
            return;
        ing_gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof odd);
}

static void ing_crc32c_zeros(uint32_t zeros[4][256], size_t len) {
    uint32_t op[32];
    ing_crc32c_zeros_op(op, len);
    for (uint32_t n = 0; n < 256; ++n)
        for (int b = 0; b < 4; ++b)
            zeros[b][n] = ing_gf2_times(op, n << (8 * b));
}

static uint32_t ing_crc32c_shift(uint32_t zeros[4][256], uint32_t c) {
    return zeros[0][c & 0xFF] ^ zeros[1][(c >> 8) & 0xFF] ^ zeros[2][(c >> 16) & 0xFF] ^ zeros[3][c >> 24];
}
#endif

static void ing_crc32c_init(void) {
    if (ing_crc32c_table[0][1] != 0)
        return;
    for (uint32_t b = 0; b < 256; ++b) {
        uint32_t c = b;
        for (int k = 0; k < 8; ++k)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        ing_crc32c_table[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b)
        for (int t = 1; t < 8; ++t)
            ing_crc32c_table[t][b] =
                (ing_crc32c_table[t - 1][b] >> 8) ^ ing_crc32c_table[0][ing_crc32c_table[t - 1][b] & 0xFF];
#ifdef ING_CRC32C_X86
    ing_crc32c_zeros(ing_crc32c_long, ING_CRC32C_LONG);
    ing_crc32c_zeros(ing_crc32c_short, ING_CRC32C_SHORT);
    __builtin_cpu_init();
    ing_crc32c_hw = __builtin_cpu_supports("sse4.2");
#endif
}

/* The register form (pre- and post-inverted by the caller) over tables, 8 bytes a step. */
static uint32_t ing_crc32c_sw(uint32_t c, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ ing_crc32c_table[0][(c ^ *p++) & 0xFF];
        --n;
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= c;
        c = ing_crc32c_table[7][lo & 0xFF] ^ ing_crc32c_table[6][(lo >> 8) & 0xFF] ^
            ing_crc32c_table[5][(lo >> 16) & 0xFF] ^ ing_crc32c_table[4][lo >> 24] ^
            ing_crc32c_table[3][hi & 0xFF] ^ ing_crc32c_table[2][(hi >> 8) & 0xFF] ^
            ing_crc32c_table[1][(hi >> 16) & 0xFF] ^ ing_crc32c_table[0][hi >> 24];
    }
    while (n--)
        c = (c >> 8) ^ ing_crc32c_table[0][(c ^ *p++) & 0xFF];
    return c;
}

#ifdef ING_CRC32C_X86
__attribute__((target("sse4.2"))) static uint32_t ing_crc32c_sse42(uint32_t c, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8(c, *p++);
        --n;
    }
    uint64_t c64 = c;
    static const size_t blocks[2] = {ING_CRC32C_LONG, ING_CRC32C_SHORT};
    for (int b = 0; b < 2; ++b) {
        size_t block = blocks[b];
        while (n >= 3 * block) {
            uint64_t c1 = 0, c2 = 0;
            for (const unsigned char *end = p + block; p < end; p += 8) {
                uint64_t v0, v1, v2;
                memcpy(&v0, p, 8);
                memcpy(&v1, p + block, 8);
                memcpy(&v2, p + 2 * block, 8);
                c64 = _mm_crc32_u64(c64, v0);
                c1 = _mm_crc32_u64(c1, v1);
                c2 = _mm_crc32_u64(c2, v2);
            }
            uint32_t(*zeros)[256] = b == 0 ? ing_crc32c_long : ing_crc32c_short;
            c64 = ing_crc32c_shift(zeros, (uint32_t)c64) ^ (uint32_t)c1;
            c64 = ing_crc32c_shift(zeros, (uint32_t)c64) ^ (uint32_t)c2;
            p += 2 * block;
            n -= 3 * block;
        }
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = _mm_crc32_u64(c64, v);
    }
    c = (uint32_t)c64;
    while (n--)
        c = _mm_crc32_u8(c, *p++);
    return c;
}
#endif

static uint32_t ing_crc32c(uint32_t crc, const void *data, size_t n) {
    uint32_t c = ~crc;
#ifdef ING_CRC32C_X86
    if (ing_crc32c_hw)
        return ~ing_crc32c_sse42(c, (const unsigned char *)data, n);
#endif
    return ~ing_crc32c_sw(c, (const unsigned char *)data, n);
}

#endif
