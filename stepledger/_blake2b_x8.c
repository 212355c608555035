/* BLAKE2b of eight messages at once (AVX-512F), for the digests of stepledger: a unit of its own, so
 * that it compiles side by side with the core (setup.py). See _blake2b.h. */
#define SL_SIMD_UNIT 1
#include "_blake2b.h"

#if SL_HAVE_X4
#include <immintrin.h>

/* ---------------------------------------------------------------------------
 * Eight messages of equal length at once, one per 64-bit lane of an AVX-512
 * register, with its native 64-bit rotates. Message k starts at
 * base + k * stride and is followed by zeros up to a multiple of 128 bytes
 * (stride is at least that), so every block is read in place. Used only when
 * the CPU has AVX-512F (checked at run time); the results are those of the
 * scalar code above.
 * ------------------------------------------------------------------------- */
#define SL_X8_ATTR __attribute__((target("avx512f")))

#define SL_X8_G(a, b, c, d, x, y) SL_G_WITH(_mm512_add_epi64, _mm512_xor_si512, _mm512_ror_epi64, a, b, c, d, x, y)
#define SL_X8_ROUND(r) SL_ROUND_WITH(SL_X8_G, r)

/* One compression of eight lanes' blocks whose words from ``words`` on are zeros (16: none are known
 * to be). Inlined where ``words`` is a constant, so that a short message's last block skips the
 * gathers of its zero words and every addition of one, as sl_x4_compress_last does. */
SL_X8_ATTR static inline __attribute__((always_inline)) void sl_x8_compress_words(
        __m512i h[8], const uint8_t *block, __m512i lanes, uint64_t t, int last, const int words) {
    __m512i v[16], m[16];
    int i;
    /* word i of every lane's block: one gather per word */
#pragma GCC unroll 16
    for (i = 0; i < 16; i++)
        m[i] = i < words ? _mm512_i64gather_epi64(lanes, (const void *)(block + 8 * i), 1) : _mm512_setzero_si512();
    for (i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = _mm512_set1_epi64((long long)sl_blake2b_iv[i]);
    }
    v[12] = _mm512_xor_si512(v[12], _mm512_set1_epi64((long long)t));
    if (last) v[14] = _mm512_xor_si512(v[14], _mm512_set1_epi64(-1LL));
    SL_X8_ROUND(0); SL_X8_ROUND(1); SL_X8_ROUND(2); SL_X8_ROUND(3);
    SL_X8_ROUND(4); SL_X8_ROUND(5); SL_X8_ROUND(6); SL_X8_ROUND(7);
    SL_X8_ROUND(8); SL_X8_ROUND(9); SL_X8_ROUND(10); SL_X8_ROUND(11);
    for (i = 0; i < 8; i++) h[i] = _mm512_xor_si512(h[i], _mm512_xor_si512(v[i], v[i + 8]));
}

SL_X8_ATTR static void sl_x8_compress(__m512i h[8], const uint8_t *block, __m512i lanes, uint64_t t, int last) {
    sl_x8_compress_words(h, block, lanes, t, last, 16);
}

/* 8-byte digests of eight messages of ``len`` bytes, laid out as said above (little-endian host).
 * The byte counter's high word stays 0: a message here is far below 2^64 bytes. */
SL_X8_ATTR SL_SIMD_ENTRY void sl_blake2b64_x8(const uint8_t *base, size_t stride, size_t len, uint64_t out[8]) {
    __m512i h[8];
    const __m512i lanes = _mm512_set_epi64((long long)(7 * stride), (long long)(6 * stride),
                                           (long long)(5 * stride), (long long)(4 * stride),
                                           (long long)(3 * stride), (long long)(2 * stride),
                                           (long long)stride, 0LL);
    size_t blocks = len ? (len + 127) / 128 : 1, b, rest = len - 128 * (blocks - 1);
    const uint8_t *last = base + 128 * (blocks - 1);
    int i;
    for (i = 0; i < 8; i++) h[i] = _mm512_set1_epi64((long long)sl_blake2b_iv[i]);
    h[0] = _mm512_xor_si512(h[0], _mm512_set1_epi64((long long)(0x01010000ULL ^ 8ULL)));
    for (b = 0; b + 1 < blocks; b++) sl_x8_compress(h, base + 128 * b, lanes, (uint64_t)(128 * (b + 1)), 0);
    /* the last block's words past the message are zeros: small messages take a compression without them */
    if (rest <= 16) sl_x8_compress_words(h, last, lanes, (uint64_t)len, 1, 2);
    else if (rest <= 24) sl_x8_compress_words(h, last, lanes, (uint64_t)len, 1, 3);
    else if (rest <= 32) sl_x8_compress_words(h, last, lanes, (uint64_t)len, 1, 4);
    else if (rest <= 64) sl_x8_compress_words(h, last, lanes, (uint64_t)len, 1, 8);
    else sl_x8_compress(h, last, lanes, (uint64_t)len, 1);
    _mm512_storeu_si512((void *)out, h[0]);
}

#else
typedef int sl_x8_unused;  /* not x86-64 with GCC or Clang: the core uses the scalar code */
#endif
