/* The hash behind `ingest.random.SampleRandom`, shared by the C modules that draw its numbers: splitmix64's
 * finalizer, a value combined into a hash, and a 53-bit uniform float from a word. */
#ifndef INGEST_SPLITMIX_H
#define INGEST_SPLITMIX_H

#include <stdint.h>

#define GOLDEN 0x9E3779B97F4A7C15ULL

static inline uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static inline uint64_t combine(uint64_t h, uint64_t v) { return mix(h ^ mix(v + GOLDEN)); }

static inline double unit(uint64_t x) { return (double)(x >> 11) * 0x1.0p-53; }

#endif
