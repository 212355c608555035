/* BLAKE2b of four messages at once (AVX2), and two small ones, for the digests of stepledger: a unit of its own, so
 * that it compiles side by side with the core (setup.py). See _blake2b.h. */
#define SL_SIMD_UNIT 1
#include "_blake2b.h"

#if SL_HAVE_X4
#include <immintrin.h>

/* ---------------------------------------------------------------------------
 * Four messages of equal length at once, one per 64-bit lane of an AVX2
 * register. The trainer side digests one row per env, all of one length, so
 * four envs cost about one compression. Used only when the CPU has AVX2
 * (checked at run time); the results are those of the scalar code above.
 * ------------------------------------------------------------------------- */
#define SL_X4_ATTR __attribute__((target("avx2")))

SL_X4_ATTR static inline __m256i sl_x4_rotr32(__m256i x) { return _mm256_shuffle_epi32(x, 0xB1); }
SL_X4_ATTR static inline __m256i sl_x4_rotr24(__m256i x) {
    const __m256i r = _mm256_setr_epi8(3, 4, 5, 6, 7, 0, 1, 2, 11, 12, 13, 14, 15, 8, 9, 10,
                                       3, 4, 5, 6, 7, 0, 1, 2, 11, 12, 13, 14, 15, 8, 9, 10);
    return _mm256_shuffle_epi8(x, r);
}
SL_X4_ATTR static inline __m256i sl_x4_rotr16(__m256i x) {
    const __m256i r = _mm256_setr_epi8(2, 3, 4, 5, 6, 7, 0, 1, 10, 11, 12, 13, 14, 15, 8, 9,
                                       2, 3, 4, 5, 6, 7, 0, 1, 10, 11, 12, 13, 14, 15, 8, 9);
    return _mm256_shuffle_epi8(x, r);
}
SL_X4_ATTR static inline __m256i sl_x4_rotr63(__m256i x) {
    return _mm256_or_si256(_mm256_srli_epi64(x, 63), _mm256_add_epi64(x, x));
}

#define SL_X4_ROTR(x, n) sl_x4_rotr##n(x)
#define SL_X4_G(a, b, c, d, x, y) SL_G_WITH(_mm256_add_epi64, _mm256_xor_si256, SL_X4_ROTR, a, b, c, d, x, y)
#define SL_X4_ROUND(r) SL_ROUND_WITH(SL_X4_G, r)

/* Load words i .. i+3 of each lane's block and transpose 4x4, so that m[i + j] holds word i + j of every lane. */
SL_X4_ATTR static inline __attribute__((always_inline)) void sl_x4_load4(__m256i m[16], const uint8_t *blocks[4],
                                                                         int i) {
    __m256i a = _mm256_loadu_si256((const __m256i *)(blocks[0] + 8 * i));
    __m256i b = _mm256_loadu_si256((const __m256i *)(blocks[1] + 8 * i));
    __m256i c = _mm256_loadu_si256((const __m256i *)(blocks[2] + 8 * i));
    __m256i d = _mm256_loadu_si256((const __m256i *)(blocks[3] + 8 * i));
    __m256i ab_lo = _mm256_unpacklo_epi64(a, b), ab_hi = _mm256_unpackhi_epi64(a, b);
    __m256i cd_lo = _mm256_unpacklo_epi64(c, d), cd_hi = _mm256_unpackhi_epi64(c, d);
    m[i + 0] = _mm256_permute2x128_si256(ab_lo, cd_lo, 0x20);
    m[i + 1] = _mm256_permute2x128_si256(ab_hi, cd_hi, 0x20);
    m[i + 2] = _mm256_permute2x128_si256(ab_lo, cd_lo, 0x31);
    m[i + 3] = _mm256_permute2x128_si256(ab_hi, cd_hi, 0x31);
}

SL_X4_ATTR static void sl_x4_compress(__m256i h[8], const uint8_t *blocks[4], __m256i t0, __m256i t1, int last) {
    __m256i v[16], m[16];
    int i;
    for (i = 0; i < 16; i += 4) {
        sl_x4_load4(m, blocks, i);
    }
    for (i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = _mm256_set1_epi64x((long long)sl_blake2b_iv[i]);
    }
    v[12] = _mm256_xor_si256(v[12], t0);
    v[13] = _mm256_xor_si256(v[13], t1);
    if (last) v[14] = _mm256_xor_si256(v[14], _mm256_set1_epi64x(-1LL));
    SL_X4_ROUND(0); SL_X4_ROUND(1); SL_X4_ROUND(2); SL_X4_ROUND(3);
    SL_X4_ROUND(4); SL_X4_ROUND(5); SL_X4_ROUND(6); SL_X4_ROUND(7);
    SL_X4_ROUND(8); SL_X4_ROUND(9); SL_X4_ROUND(10); SL_X4_ROUND(11);
    for (i = 0; i < 8; i++) h[i] = _mm256_xor_si256(h[i], _mm256_xor_si256(v[i], v[i + 8]));
}

/* 8-byte digests of four messages of ``len`` bytes each (little-endian host). */
SL_X4_ATTR SL_SIMD_ENTRY void sl_blake2b64_x4(const uint8_t *msg[4], size_t len, uint64_t out[4]) {
    __m256i h[8];
    uint8_t tail[4][128];
    const uint8_t *blocks[4];
    uint64_t t0 = 0, t1 = 0;
    size_t off = 0, rest;
    int i, k;
    for (i = 0; i < 8; i++) h[i] = _mm256_set1_epi64x((long long)sl_blake2b_iv[i]);
    h[0] = _mm256_xor_si256(h[0], _mm256_set1_epi64x((long long)(0x01010000ULL ^ 8ULL)));
    /* every block but the last is compressed as it is */
    while (len - off > 128) {
        for (k = 0; k < 4; k++) blocks[k] = msg[k] + off;
        t0 += 128;
        if (t0 < 128) t1++;
        sl_x4_compress(h, blocks, _mm256_set1_epi64x((long long)t0), _mm256_set1_epi64x((long long)t1), 0);
        off += 128;
    }
    rest = len - off;
    for (k = 0; k < 4; k++) {
        memset(tail[k], 0, 128);
        if (rest) memcpy(tail[k], msg[k] + off, rest);
        blocks[k] = tail[k];
    }
    t0 += rest;
    if (t0 < rest) t1++;
    sl_x4_compress(h, blocks, _mm256_set1_epi64x((long long)t0), _mm256_set1_epi64x((long long)t1), 1);
    _mm256_storeu_si256((__m256i *)out, h[0]);
}

/* sl_x4_compress of a message's last block, whose words from ``words`` on are zero (the padding
 * after a short message). Inlined where ``words`` is a constant, so the compiler drops the loads of
 * the zero words and every addition of one (most of a short message's 192 message additions); the
 * results are sl_x4_compress's. */
SL_X4_ATTR static inline __attribute__((always_inline)) void sl_x4_compress_last(
        __m256i h[8], const uint8_t *blocks[4], __m256i t0, const int words) {
    __m256i v[16], m[16];
    int i;
#pragma GCC unroll 4
    for (i = 0; i < 16; i += 4) {
        if (i >= words) {
            m[i] = m[i + 1] = m[i + 2] = m[i + 3] = _mm256_setzero_si256();
            continue;
        }
        sl_x4_load4(m, blocks, i);
    }
#pragma GCC unroll 16
    for (i = words; i < 16; i++) m[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = _mm256_set1_epi64x((long long)sl_blake2b_iv[i]);
    }
    v[12] = _mm256_xor_si256(v[12], t0);
    v[14] = _mm256_xor_si256(v[14], _mm256_set1_epi64x(-1LL));
    SL_X4_ROUND(0); SL_X4_ROUND(1); SL_X4_ROUND(2); SL_X4_ROUND(3);
    SL_X4_ROUND(4); SL_X4_ROUND(5); SL_X4_ROUND(6); SL_X4_ROUND(7);
    SL_X4_ROUND(8); SL_X4_ROUND(9); SL_X4_ROUND(10); SL_X4_ROUND(11);
#pragma GCC unroll 8
    for (i = 0; i < 8; i++) h[i] = _mm256_xor_si256(h[i], _mm256_xor_si256(v[i], v[i + 8]));
}

/* 8-byte digests of four messages of ``len`` bytes, laid out as sl_blake2b64_x8's are: message k at
 * base + k * stride, followed by zeros up to a multiple of 128 bytes, so that every block is read in
 * place (no copy into a zeroed tail). The trainer side keeps its rows laid out so between calls. */
SL_X4_ATTR SL_SIMD_ENTRY void sl_blake2b64_x4_laid(const uint8_t *base, size_t stride, size_t len, uint64_t out[4]) {
    __m256i h[8];
    const uint8_t *blocks[4];
    size_t nblocks = len ? (len + 127) / 128 : 1, b, rest = len - 128 * (nblocks - 1);
    __m256i t;
    int i, k;
    for (i = 0; i < 8; i++) h[i] = _mm256_set1_epi64x((long long)sl_blake2b_iv[i]);
    h[0] = _mm256_xor_si256(h[0], _mm256_set1_epi64x((long long)(0x01010000ULL ^ 8ULL)));
    for (b = 0; b + 1 < nblocks; b++) {
        for (k = 0; k < 4; k++) blocks[k] = base + k * stride + 128 * b;
        sl_x4_compress(h, blocks, _mm256_set1_epi64x((long long)(128 * (b + 1))), _mm256_setzero_si256(), 0);
    }
    for (k = 0; k < 4; k++) blocks[k] = base + k * stride + 128 * (nblocks - 1);
    t = _mm256_set1_epi64x((long long)len);
    /* the last block's words past the message are zeros: small messages take a compression without them */
    if (rest <= 16) sl_x4_compress_last(h, blocks, t, 2);
    else if (rest <= 24) sl_x4_compress_last(h, blocks, t, 3);
    else if (rest <= 32) sl_x4_compress_last(h, blocks, t, 4);
    else if (rest <= 64) sl_x4_compress_last(h, blocks, t, 8);
    else sl_x4_compress(h, blocks, t, _mm256_setzero_si256(), 1);
    _mm256_storeu_si256((__m256i *)out, h[0]);
}

/* 8-byte digests of two messages of at most 128 bytes each, each already zero-padded to a whole
 * 128-byte block (b0 and b1 are 128 bytes), read in place: one compression each, with a state's
 * four rows in four AVX2 registers (a row's four G steps at once; the diagonal step rotates rows
 * b, c and d into place and back). The two compressions are written interleaved, step by step, so
 * that each one's chain of dependent steps runs while the other's waits: both cost about a third
 * of the instructions, and fewer cycles, than one four-lane compression with two lanes idle. The
 * env side digests a step's observation and action this way. Only word 0 of each state is
 * computed into the result. */
#define SL_ROW_HALF_G(k, x, rot_d, rot_b)                                      \
    do {                                                                       \
        a##k = _mm256_add_epi64(_mm256_add_epi64(a##k, b##k), (x));            \
        d##k = rot_d(_mm256_xor_si256(d##k, a##k));                            \
        c##k = _mm256_add_epi64(c##k, d##k);                                   \
        b##k = rot_b(_mm256_xor_si256(b##k, c##k));                            \
    } while (0)
/* message word i of the block at p: 0 from ``words`` on, without a load (the padding is zeros) */
#define SL_ROW_W(p, i) ((i) < words ? (long long)sl_load64((p) + 8 * (i)) : 0LL)
/* message words i, j, k, l of round r's order into lanes 0..3 */
#define SL_ROW_M(p, r, i, j, k, l)                                             \
    _mm256_set_epi64x(SL_ROW_W(p, sl_blake2b_sigma[r][l]), SL_ROW_W(p, sl_blake2b_sigma[r][k]), \
                      SL_ROW_W(p, sl_blake2b_sigma[r][j]), SL_ROW_W(p, sl_blake2b_sigma[r][i]))
#define SL_ROW_G2(i, j, k, l, i2, j2, k2, l2, r)                               \
    do {                                                                       \
        SL_ROW_HALF_G(0, SL_ROW_M(p0, r, i, j, k, l), sl_x4_rotr32, sl_x4_rotr24); \
        SL_ROW_HALF_G(1, SL_ROW_M(p1, r, i, j, k, l), sl_x4_rotr32, sl_x4_rotr24); \
        SL_ROW_HALF_G(0, SL_ROW_M(p0, r, i2, j2, k2, l2), sl_x4_rotr16, sl_x4_rotr63); \
        SL_ROW_HALF_G(1, SL_ROW_M(p1, r, i2, j2, k2, l2), sl_x4_rotr16, sl_x4_rotr63); \
    } while (0)
#define SL_ROW_PERMUTE(pb, pc, pd)                                             \
    do {                                                                       \
        b0 = _mm256_permute4x64_epi64(b0, pb); b1 = _mm256_permute4x64_epi64(b1, pb); \
        c0 = _mm256_permute4x64_epi64(c0, pc); c1 = _mm256_permute4x64_epi64(c1, pc); \
        d0 = _mm256_permute4x64_epi64(d0, pd); d1 = _mm256_permute4x64_epi64(d1, pd); \
    } while (0)
#define SL_ROW_ROUND2(r)                                                       \
    do {                                                                       \
        SL_ROW_G2(0, 2, 4, 6, 1, 3, 5, 7, r);                                  \
        SL_ROW_PERMUTE(0x39, 0x4E, 0x93);                                      \
        SL_ROW_G2(8, 10, 12, 14, 9, 11, 13, 15, r);                            \
        SL_ROW_PERMUTE(0x93, 0x4E, 0x39);                                      \
    } while (0)

/* The two compressions of blocks whose words from ``words`` on are zero. Inlined where ``words`` is
 * a constant, so the compiler drops the loads of the zero words and every addition of one, as
 * sl_x4_compress_last does. */
SL_X4_ATTR static inline __attribute__((always_inline)) void sl_x2_rows(
        const uint8_t *p0, size_t len0, const uint8_t *p1, size_t len1, uint64_t out[2], const int words) {
    const uint64_t h0 = sl_blake2b_iv[0] ^ 0x01010000ULL ^ 8ULL;
    __m256i a0, b0, c0, d0, a1, b1, c1, d1;
    a0 = a1 = _mm256_set_epi64x((long long)sl_blake2b_iv[3], (long long)sl_blake2b_iv[2],
                                (long long)sl_blake2b_iv[1], (long long)h0);
    b0 = b1 = _mm256_set_epi64x((long long)sl_blake2b_iv[7], (long long)sl_blake2b_iv[6],
                                (long long)sl_blake2b_iv[5], (long long)sl_blake2b_iv[4]);
    c0 = c1 = _mm256_set_epi64x((long long)sl_blake2b_iv[3], (long long)sl_blake2b_iv[2],
                                (long long)sl_blake2b_iv[1], (long long)sl_blake2b_iv[0]);
    /* the byte counter (its high word 0) and the final-block flag */
    d0 = _mm256_set_epi64x((long long)sl_blake2b_iv[7], (long long)~sl_blake2b_iv[6], (long long)sl_blake2b_iv[5],
                           (long long)(sl_blake2b_iv[4] ^ (uint64_t)len0));
    d1 = _mm256_set_epi64x((long long)sl_blake2b_iv[7], (long long)~sl_blake2b_iv[6], (long long)sl_blake2b_iv[5],
                           (long long)(sl_blake2b_iv[4] ^ (uint64_t)len1));
    SL_ROW_ROUND2(0); SL_ROW_ROUND2(1); SL_ROW_ROUND2(2); SL_ROW_ROUND2(3);
    SL_ROW_ROUND2(4); SL_ROW_ROUND2(5); SL_ROW_ROUND2(6); SL_ROW_ROUND2(7);
    SL_ROW_ROUND2(8); SL_ROW_ROUND2(9); SL_ROW_ROUND2(10); SL_ROW_ROUND2(11);
    out[0] = h0 ^ (uint64_t)_mm_cvtsi128_si64(_mm256_castsi256_si128(_mm256_xor_si256(a0, c0)));
    out[1] = h0 ^ (uint64_t)_mm_cvtsi128_si64(_mm256_castsi256_si128(_mm256_xor_si256(a1, c1)));
}

SL_X4_ATTR SL_SIMD_ENTRY void sl_blake2b64_x2_padded(const uint8_t *b0, size_t len0, const uint8_t *b1, size_t len1,
                                                            uint64_t out[2]) {
    size_t longer = len0 > len1 ? len0 : len1;
    /* short messages (a classic-control observation, a Discrete or small Box action) skip their zero words */
    if (longer <= 16) sl_x2_rows(b0, len0, b1, len1, out, 2);
    else if (longer <= 24) sl_x2_rows(b0, len0, b1, len1, out, 3);
    else if (longer <= 32) sl_x2_rows(b0, len0, b1, len1, out, 4);
    else if (longer <= 64) sl_x2_rows(b0, len0, b1, len1, out, 8);
    else sl_x2_rows(b0, len0, b1, len1, out, 16);
}

#else
typedef int sl_x4_unused;  /* not x86-64 with GCC or Clang: the core uses the scalar code */
#endif
