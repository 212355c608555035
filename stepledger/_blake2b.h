/* BLAKE2b (RFC 7693), unkeyed, streaming, for the digests of stepledger.
 *
 * Written from the RFC's description. Only what the core needs: init with an
 * output length, update, final. Checked bit for bit against hashlib.blake2b
 * in tests/test_digest.py. Portable C99: the byte order of the machine does
 * not matter because words are loaded and stored byte by byte. */
#ifndef STEPLEDGER_BLAKE2B_H
#define STEPLEDGER_BLAKE2B_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <stdlib.h>

typedef struct {
    uint64_t h[8];
    uint64_t t[2];
    uint8_t buf[128];
    size_t fill;
    size_t outlen;
} sl_blake2b_state;

static const uint64_t sl_blake2b_iv[8] = {
    0x6A09E667F3BCC908ULL, 0xBB67AE8584CAA73BULL,
    0x3C6EF372FE94F82BULL, 0xA54FF53A5F1D36F1ULL,
    0x510E527FADE682D1ULL, 0x9B05688C2B3E6C1FULL,
    0x1F83D9ABFB41BD6BULL, 0x5BE0CD19137E2179ULL
};

static const uint8_t sl_blake2b_sigma[12][16] = {
    { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9,10,11,12,13,14,15},
    {14,10, 4, 8, 9,15,13, 6, 1,12, 0, 2,11, 7, 5, 3},
    {11, 8,12, 0, 5, 2,15,13,10,14, 3, 6, 7, 1, 9, 4},
    { 7, 9, 3, 1,13,12,11,14, 2, 6, 5,10, 4, 0,15, 8},
    { 9, 0, 5, 7, 2, 4,10,15,14, 1,11,12, 6, 8, 3,13},
    { 2,12, 6,10, 0,11, 8, 3, 4,13, 7, 5,15,14, 1, 9},
    {12, 5, 1,15,14,13, 4,10, 0, 7, 6, 3, 9, 2, 8,11},
    {13,11, 7,14,12, 1, 3, 9, 5, 0,15, 4, 8, 6, 2,10},
    { 6,15,14, 9,11, 3, 0, 8,12, 2,13, 7, 1, 4,10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5,15,11, 9,14, 3,12,13, 0},
    { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9,10,11,12,13,14,15},
    {14,10, 4, 8, 9,15,13, 6, 1,12, 0, 2,11, 7, 5, 3}
};

static inline uint64_t sl_load64(const uint8_t *p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
#else
    return ((uint64_t)p[0])       | ((uint64_t)p[1] << 8)  |
           ((uint64_t)p[2] << 16) | ((uint64_t)p[3] << 24) |
           ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40) |
           ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
#endif
}

static inline uint64_t sl_rotr64(uint64_t x, unsigned n) {
    return (x >> n) | (x << (64 - n));
}

/* G and one round, for any kind of word: ADD, XOR and ROTR(x, n) say how words are added, xored
 * and rotated right (plain 64-bit words here; four or eight lanes of them below). The rounds are
 * written out so that every sigma index is a compile-time constant and the message words stay in
 * registers. */
#define SL_G_WITH(ADD, XOR, ROTR, a, b, c, d, x, y)                            \
    do {                                                                       \
        v[a] = ADD(ADD(v[a], v[b]), (x));                                      \
        v[d] = ROTR(XOR(v[d], v[a]), 32);                                      \
        v[c] = ADD(v[c], v[d]);                                                \
        v[b] = ROTR(XOR(v[b], v[c]), 24);                                      \
        v[a] = ADD(ADD(v[a], v[b]), (y));                                      \
        v[d] = ROTR(XOR(v[d], v[a]), 16);                                      \
        v[c] = ADD(v[c], v[d]);                                                \
        v[b] = ROTR(XOR(v[b], v[c]), 63);                                      \
    } while (0)

#define SL_ROUND_WITH(G, r)                                                    \
    do {                                                                       \
        G(0, 4,  8, 12, m[sl_blake2b_sigma[r][ 0]], m[sl_blake2b_sigma[r][ 1]]); \
        G(1, 5,  9, 13, m[sl_blake2b_sigma[r][ 2]], m[sl_blake2b_sigma[r][ 3]]); \
        G(2, 6, 10, 14, m[sl_blake2b_sigma[r][ 4]], m[sl_blake2b_sigma[r][ 5]]); \
        G(3, 7, 11, 15, m[sl_blake2b_sigma[r][ 6]], m[sl_blake2b_sigma[r][ 7]]); \
        G(0, 5, 10, 15, m[sl_blake2b_sigma[r][ 8]], m[sl_blake2b_sigma[r][ 9]]); \
        G(1, 6, 11, 12, m[sl_blake2b_sigma[r][10]], m[sl_blake2b_sigma[r][11]]); \
        G(2, 7,  8, 13, m[sl_blake2b_sigma[r][12]], m[sl_blake2b_sigma[r][13]]); \
        G(3, 4,  9, 14, m[sl_blake2b_sigma[r][14]], m[sl_blake2b_sigma[r][15]]); \
    } while (0)

#define SL_ADD(a, b) ((a) + (b))
#define SL_XOR(a, b) ((a) ^ (b))
#define SL_G(a, b, c, d, x, y) SL_G_WITH(SL_ADD, SL_XOR, sl_rotr64, a, b, c, d, x, y)
#define SL_ROUND(r) SL_ROUND_WITH(SL_G, r)

#ifndef SL_SIMD_UNIT  /* the scalar code, for _core.pyx; the SIMD units need none of it */
static void sl_blake2b_compress(sl_blake2b_state *S, const uint8_t *block, int last) {
    uint64_t v[16], m[16];
    int i;
    for (i = 0; i < 16; i++) m[i] = sl_load64(block + 8 * i);
    for (i = 0; i < 8; i++) { v[i] = S->h[i]; v[i + 8] = sl_blake2b_iv[i]; }
    v[12] ^= S->t[0];
    v[13] ^= S->t[1];
    if (last) v[14] = ~v[14];
    SL_ROUND(0); SL_ROUND(1); SL_ROUND(2); SL_ROUND(3);
    SL_ROUND(4); SL_ROUND(5); SL_ROUND(6); SL_ROUND(7);
    SL_ROUND(8); SL_ROUND(9); SL_ROUND(10); SL_ROUND(11);
    for (i = 0; i < 8; i++) S->h[i] ^= v[i] ^ v[i + 8];
}

static inline void sl_blake2b_init(sl_blake2b_state *S, size_t outlen) {
    int i;
    for (i = 0; i < 8; i++) S->h[i] = sl_blake2b_iv[i];
    /* parameter block: digest length, key length 0, fanout 1, depth 1 */
    S->h[0] ^= 0x01010000ULL ^ (uint64_t)outlen;
    S->t[0] = 0;
    S->t[1] = 0;
    S->fill = 0;
    S->outlen = outlen;
}

static inline void sl_blake2b_increment(sl_blake2b_state *S, uint64_t n) {
    S->t[0] += n;
    if (S->t[0] < n) S->t[1]++;
}

/* The last block must be compressed with the final flag, so a full buffer
 * is only compressed once more input is known to follow. */
static void sl_blake2b_update(sl_blake2b_state *S, const void *data, size_t len) {
    const uint8_t *in = (const uint8_t *)data;
    if (len == 0) return;
    size_t room = 128 - S->fill;
    if (len > room) {
        memcpy(S->buf + S->fill, in, room);
        sl_blake2b_increment(S, 128);
        sl_blake2b_compress(S, S->buf, 0);
        S->fill = 0;
        in += room;
        len -= room;
        while (len > 128) {
            sl_blake2b_increment(S, 128);
            sl_blake2b_compress(S, in, 0);
            in += 128;
            len -= 128;
        }
    }
    memcpy(S->buf + S->fill, in, len);
    S->fill += len;
}

static void sl_blake2b_final(sl_blake2b_state *S, uint8_t *out) {
    size_t i;
    sl_blake2b_increment(S, (uint64_t)S->fill);
    memset(S->buf + S->fill, 0, 128 - S->fill);
    sl_blake2b_compress(S, S->buf, 1);
    for (i = 0; i < S->outlen; i++) out[i] = (uint8_t)(S->h[i >> 3] >> (8 * (i & 7)));
}

/* The first 8 output bytes of an 8-byte digest, read little-endian. */
static inline uint64_t sl_blake2b_final64(sl_blake2b_state *S) {
    uint8_t out[8];
    sl_blake2b_final(S, out);
    return sl_load64(out);
}
#endif

/* ---------------------------------------------------------------------------
 * Several messages at once, in the lanes of SIMD registers: four (AVX2) or
 * eight (AVX-512). The code is in units of its own, _blake2b_x4.c and
 * _blake2b_x8.c, compiled side by side with the core (setup.py), each for its
 * instruction set; the core calls them only where the CPU has it (checked at
 * run time). Their results are those of the scalar code above.
 * ------------------------------------------------------------------------- */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(STEPLEDGER_NO_SIMD) \
    && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SL_HAVE_X4 1

/* Hidden: called from the core's unit as a call within the extension, not through its symbol table. */
#define SL_SIMD_ENTRY __attribute__((visibility("hidden")))

#ifndef SL_SIMD_UNIT
/* _blake2b_x4.c (AVX2) */
SL_SIMD_ENTRY void sl_blake2b64_x4(const uint8_t *msg[4], size_t len, uint64_t out[4]);
SL_SIMD_ENTRY void sl_blake2b64_x4_laid(const uint8_t *base, size_t stride, size_t len, uint64_t out[4]);
SL_SIMD_ENTRY void sl_blake2b64_x2_padded(const uint8_t *b0, size_t len0, const uint8_t *b1, size_t len1,
                                         uint64_t out[2]);
/* _blake2b_x8.c (AVX-512F) */
SL_SIMD_ENTRY void sl_blake2b64_x8(const uint8_t *base, size_t stride, size_t len, uint64_t out[8]);

static int sl_have_avx512(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = (__builtin_cpu_supports("avx512f") && getenv("STEPLEDGER_NO_AVX512") == NULL) ? 1 : 0;
    }
    return cached;
}

static int sl_have_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return cached;
}
#endif
#else
#define SL_HAVE_X4 0
static int sl_have_avx2(void) { return 0; }
static int sl_have_avx512(void) { return 0; }
static void sl_blake2b64_x8(const uint8_t *base, size_t stride, size_t len, uint64_t out[8]) {
    (void)base; (void)stride; (void)len; (void)out;
}
static void sl_blake2b64_x4(const uint8_t *msg[4], size_t len, uint64_t out[4]) {
    (void)msg; (void)len; (void)out;
}
static void sl_blake2b64_x4_laid(const uint8_t *base, size_t stride, size_t len, uint64_t out[4]) {
    (void)base; (void)stride; (void)len; (void)out;
}
static void sl_blake2b64_x2_padded(const uint8_t *b0, size_t len0, const uint8_t *b1, size_t len1,
                                   uint64_t out[2]) {
    (void)b0; (void)len0; (void)b1; (void)len1; (void)out;
}
#endif

#endif