/* CRC32C (Castagnoli), as the crc32c package computes it: ing_crc32c(0, data, n) == crc32c.crc32c(data), and
 * ing_crc32c(ing_crc32c(0, a, n), b, m) is the CRC of a followed by b.
 *
 * Where the CPU has SSE4.2 (x86-64, checked at run time) the crc32 instruction does it 8 bytes a step; elsewhere,
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
static int ing_crc32c_hw;

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
