// A GEMM for few rows: out[m, n] = sum_k x[m, k] * w[n, k], fp32, w row-major (transformers'
// (out, in) weight layout), x and out rows contiguous. Used by the CPU grouped GEMM for experts that
// got few rows, as in decoding (~16 rows per expert at RL shapes).
//
// Why not BLAS there: MKL packs the weight into a buffer before every product. At 16 rows the
// packing and the second pass over the packed copy cost more than the arithmetic, and decoding
// streams every expert's weights from memory once per token: 16 x 128 x 512 took ~65 us cold in
// MKL. This kernel reads each weight row once, straight from where it lies, prefetched a few tiles
// ahead, and keeps the few input rows in L1: a 4 x 4 register tile of dot products over k, 8 lanes
// wide (AVX2 + FMA; the caller checks the CPU has them).
#pragma once

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HINTRL_SMALL_GEMM 1

namespace hintrl {

// Sum of each of four 8-lane accumulators, as 4 floats.
__attribute__((target("avx2,fma"))) inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // per 128-bit half: a, b, c, d partial sums
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// Rows m0..m0+MB of out, columns n0..n0+4.
template <int MB>
__attribute__((target("avx2,fma"))) inline void small_gemm_tile(const float* x, int64_t ldx, const float* w,
                                                                 int64_t ldw, int64_t K, float* out, int64_t ldo) {
  __m256 acc[MB][4];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    __m256 wv[4];
    for (int j = 0; j < 4; ++j) wv[j] = _mm256_loadu_ps(w + j * ldw + k);
    for (int i = 0; i < MB; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MB; ++i) _mm_storeu_ps(out + i * ldo, hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
}

// The hardware prefetcher does not run ahead of these short row streams; asking for the weight rows a
// few tiles ahead took a 4-layer decode's expert products from 391 to 274 us per grouped GEMM (1
// thread; prefetching into L1 instead did not help).
constexpr int64_t kPrefetchTiles = 3;

// Whether the kernel takes these sizes (else the caller uses BLAS).
inline bool small_gemm_fits(int64_t K, int64_t N) { return K % 8 == 0 && N % 4 == 0 && K > 0; }

inline bool small_gemm_cpu_ok() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

// out (M x N, row stride ldo) = x (M x K, row stride ldx) times w^T (w: N x K, row stride ldw).
__attribute__((target("avx2,fma"))) inline void small_gemm_nt(const float* x, int64_t ldx, const float* w,
                                                              int64_t ldw, float* out, int64_t ldo, int64_t M,
                                                              int64_t N, int64_t K) {
  // Column tiles outermost: a tile's 4 weight rows are read from memory once and reused from L1
  // for every row block.
  for (int64_t n0 = 0; n0 < N; n0 += 4) {
    const float* wt = w + n0 * ldw;
    if (n0 + 4 * kPrefetchTiles + 4 <= N)  // the weight rows of the tile kPrefetchTiles ahead, into L2
      for (int j = 0; j < 4; ++j)
        for (int64_t k = 0; k < K; k += 16)
          _mm_prefetch(reinterpret_cast<const char*>(wt + (4 * kPrefetchTiles + j) * ldw + k), _MM_HINT_T1);
    int64_t m0 = 0;
    for (; m0 + 4 <= M; m0 += 4) small_gemm_tile<4>(x + m0 * ldx, ldx, wt, ldw, K, out + m0 * ldo + n0, ldo);
    switch (M - m0) {
      case 3: small_gemm_tile<3>(x + m0 * ldx, ldx, wt, ldw, K, out + m0 * ldo + n0, ldo); break;
      case 2: small_gemm_tile<2>(x + m0 * ldx, ldx, wt, ldw, K, out + m0 * ldo + n0, ldo); break;
      case 1: small_gemm_tile<1>(x + m0 * ldx, ldx, wt, ldw, K, out + m0 * ldo + n0, ldo); break;
      default: break;
    }
  }
}

}  // namespace hintrl
#endif
