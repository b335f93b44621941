/* Reading byte ranges of a file with preadv, pure C (no Python). Included by ingest/_readv.c (a batch of reads
 * for Python) and the native engine (ingest/_native/engine.c), so both read with one piece of code.
 *
 * ing_preadv_full(fd, offset, addrs, lens, nseg, scratch) reads from byte `offset` of `fd` into the segments
 * (addrs[s], lens[s]), s = 0 .. nseg - 1, in order, with preadv until every segment is full or the file ends;
 * a segment of address 0 is read into `scratch` (at least that long) and dropped. Returns the bytes read
 * (fewer than asked where the file ends early) or -errno. EINTR is retried.
 */
#ifndef INGEST_NATIVE_PREADV_H
#define INGEST_NATIVE_PREADV_H

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

static inline int64_t ing_preadv_full(int fd, int64_t offset, const uint64_t *addrs, const int64_t *lens,
                                      ptrdiff_t nseg, char *scratch) {
    struct iovec iov[IOV_MAX];
    int64_t done = 0;
    ptrdiff_t s = 0;
    size_t into = 0; /* bytes of segment s already read */
    while (s < nseg) {
        int cnt = 0;
        for (ptrdiff_t t = s; t < nseg && cnt < IOV_MAX; ++t, ++cnt) {
            size_t skip = t == s ? into : 0;
            iov[cnt].iov_base = (addrs[t] ? (char *)(uintptr_t)addrs[t] : scratch) + skip;
            iov[cnt].iov_len = (size_t)lens[t] - skip;
        }
        ssize_t got = preadv(fd, iov, cnt, offset + done);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return -(int64_t)errno;
        }
        if (got == 0)
            break; /* the file ends early: the caller sees a short count */
        done += got;
        size_t left = (size_t)got;
        while (s < nseg && left >= (size_t)lens[s] - into) {
            left -= (size_t)lens[s] - into;
            into = 0;
            ++s;
        }
        into += left;
    }
    return done;
}

#endif
