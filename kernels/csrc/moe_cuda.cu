// CUDA kernels of the hintrl routing ops. Index logic comes from moe_core.h (also compiled for the
// CPU and tested there); this file adds the thread mapping. No ATen headers here on purpose.
// Shape legend: see moe_core.h.
#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "moe_core.h"
#include "moe_cuda_launch.h"

namespace hintrl {

// torch compiles with __CUDA_NO_{HALF,BFLOAT16}_CONVERSIONS__, so spell the conversions out.
template <> __host__ __device__ __forceinline__ float cvt<float, __half>(__half x) { return __half2float(x); }
template <> __host__ __device__ __forceinline__ __half cvt<__half, float>(float x) { return __float2half(x); }
template <> __host__ __device__ __forceinline__ float cvt<float, __nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <> __host__ __device__ __forceinline__ __nv_bfloat16 cvt<__nv_bfloat16, float>(float x) {
  return __float2bfloat16(x);
}

namespace {

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

#define HINTRL_DISPATCH(dt, ...)                                   \
  switch (dt) {                                                    \
    case Dtype::F32: { using scalar_t = float; __VA_ARGS__; break; }      \
    case Dtype::F64: { using scalar_t = double; __VA_ARGS__; break; }     \
    case Dtype::F16: { using scalar_t = __half; __VA_ARGS__; break; }     \
    case Dtype::BF16: { using scalar_t = __nv_bfloat16; __VA_ARGS__; break; } \
  }

constexpr int kThreads = 256;
int64_t blocks_for(int64_t n) { return (n + kThreads - 1) / kThreads; }

// Gating runs one warp per token row: the lanes read the row's logits side by side (coalesced),
// each runs moe_core.h's pieces over its part of the row, and shuffles combine the parts: the
// softmax's max and sum, then per slot the best-ranked expert (an exact selection, the same ids as
// the CPU's; the sums differ from the CPU's by summation order only).
template <typename acc_t>
__device__ __forceinline__ acc_t warp_max(acc_t v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const acc_t o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = o > v ? o : v;
  }
  return v;
}

template <typename acc_t>
__device__ __forceinline__ acc_t warp_sum(acc_t v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename scalar_t, typename acc_t>
__device__ __forceinline__ void warp_softmax_stats(const scalar_t* row, int E, int lane, acc_t& mx, acc_t& denom) {
  mx = warp_max(part_max<scalar_t, acc_t>(row, lane, 32, E));
  denom = warp_sum(part_exp_sum<scalar_t, acc_t>(row, lane, 32, E, mx));
}

template <typename scalar_t>
__global__ void topk_gating_kernel(const scalar_t* logits, int64_t T, int E, int K, bool renorm,
                                   const int64_t* forced, typename Acc<scalar_t>::type* w, int64_t* ids) {
  using acc_t = typename Acc<scalar_t>::type;
  const int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (t >= T) return;                      // a whole warp: t is the same on all its lanes
  const scalar_t* row = logits + t * E;
  acc_t mx, denom;
  warp_softmax_stats(row, E, lane, mx, denom);
  int prev = -1;
  acc_t prev_v = 0;
  for (int k = 0; k < K; ++k) {
    int64_t id;
    if (forced != nullptr) {
      id = forced[t * K + k];
    } else {
      int best;
      acc_t best_v;
      part_best_after<scalar_t, acc_t>(row, lane, 32, E, prev, prev_v, best, best_v);
      for (int offset = 16; offset > 0; offset /= 2) {
        const int other = __shfl_xor_sync(0xffffffffu, best, offset);
        const acc_t other_v = __shfl_xor_sync(0xffffffffu, best_v, offset);
        if (other >= 0 && (best < 0 || ranks_before(other_v, other, best_v, best))) { best = other; best_v = other_v; }
      }
      prev = best;                         // every lane now holds the row's best
      prev_v = best_v;
      id = best;
    }
    if (lane == 0) write_slot(row, E, id, mx, denom, w + t * K + k, ids + t * K + k);
  }
  if (lane == 0 && renorm) renormalise(w + t * K, K);
}

template <typename scalar_t>
__global__ void topk_gating_backward_kernel(const typename Acc<scalar_t>::type* gw, const scalar_t* logits,
                                            const int64_t* ids, int64_t T, int E, int K, bool renorm,
                                            scalar_t* glogits) {
  using acc_t = typename Acc<scalar_t>::type;
  const int64_t t = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (t >= T) return;
  const scalar_t* row = logits + t * E;
  acc_t mx, denom, dp_K[kMaxTopK];
  warp_softmax_stats(row, E, lane, mx, denom);
  // K terms, the same on every lane (K is small; the reads are the same few addresses)
  const acc_t c = gating_grad_terms(gw + t * K, row, ids + t * K, E, K, renorm, mx, denom, dp_K);
  part_gating_grad(row, ids + t * K, dp_K, lane, 32, E, K, mx, denom, c, glogits + t * E);
}

__global__ void histogram_kernel(const int64_t* ids, int64_t S, int64_t C, int E, int32_t* hist) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t b = c * kCudaChunk, e = b + kCudaChunk < S ? b + kCudaChunk : S;
  chunk_histogram(ids, b, e, E, hist + c * E);
}

// Pass 2a, one block per expert, parallel over the chunks: a block-wide exclusive scan of the
// expert's column of hist_CE, kThreads chunks at a time with the running total carried over, rather
// than one thread walking all C chunks (2,048 serial steps at the Qwen3-30B-A3B shape). Same result
// as moe_core.h's expert_prefix, which the CPU runs.
__global__ void prefix_kernel(int32_t* hist, int64_t C, int E, int32_t* counts) {
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename Scan::TempStorage scratch;
  __shared__ int32_t carried;
  const int e = blockIdx.x;
  if (threadIdx.x == 0) carried = 0;
  __syncthreads();
  for (int64_t first = 0; first < C; first += kThreads) {
    const int64_t c = first + threadIdx.x;
    const int32_t h = c < C ? hist[c * E + e] : 0;
    int32_t before, total;
    Scan(scratch).ExclusiveSum(h, before, total);
    if (c < C) hist[c * E + e] = carried + before;
    __syncthreads();                       // every thread has read `carried` and the scratch
    if (threadIdx.x == 0) carried += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) counts[e] = carried;
}

__global__ void offsets_kernel(const int32_t* counts, int E, int block, int32_t* offsets) {
  offsets_from_counts(counts, E, block, offsets);
}

__global__ void positions_kernel(const int64_t* ids, int64_t S, int64_t C, int E, const int32_t* offsets,
                                 int32_t* hist, int64_t* pos, int64_t* src) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t b = c * kCudaChunk, e = b + kCudaChunk < S ? b + kCudaChunk : S;
  chunk_positions(ids, b, e, E, offsets, hist + c * E, pos);
  for (int64_t s = b; s < e; ++s)
    if (pos[s] >= 0) src[pos[s]] = s;
}

// Row copies move 16-byte words when the row allows it: these two kernels are bandwidth-bound.
template <typename scalar_t>
__global__ void gather_rows_kernel(const scalar_t* x, const int64_t* src, int K, int64_t D, bool vec, scalar_t* xs) {
  const int64_t r = blockIdx.x;
  const int64_t s = src[r];
  if (vec) {
    const int64_t n = D * sizeof(scalar_t) / 16;
    uint4* out = reinterpret_cast<uint4*>(xs + r * D);
    if (s < 0) {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = make_uint4(0, 0, 0, 0);
    } else {
      const uint4* in = reinterpret_cast<const uint4*>(x + (s / K) * D);
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i];
    }
    return;
  }
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
    xs[r * D + d] = s < 0 ? cvt<scalar_t>(typename Acc<scalar_t>::type(0)) : x[(s / K) * D + d];
}

// out[t] = sum_k w[t,k] * ys[pos[t,k]]; w == nullptr means weight 1, which makes it the
// backward of permute (the gradient of a gathered row sums back into its token).
template <typename scalar_t>
__global__ void combine_kernel(const scalar_t* ys, const int64_t* pos, const typename Acc<scalar_t>::type* w,
                               int K, int64_t D, scalar_t* out) {
  using acc_t = typename Acc<scalar_t>::type;
  const int64_t t = blockIdx.x;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    acc_t acc = 0;
    for (int k = 0; k < K; ++k) {
      const int64_t p = pos[t * K + k];
      if (p >= 0) acc += (w ? w[t * K + k] : acc_t(1)) * cvt<acc_t>(ys[p * D + d]);
    }
    out[t * D + d] = cvt<scalar_t>(acc);
  }
}

// Vectorised gather-sum for 16-byte aligned rows: out[t] = sum_k w[t,k] * rows[pos[t,k]] (w null: 1),
// each thread moving 16-byte packs, since both combine and permute's backward are bandwidth-bound.
template <typename scalar_t, int V>
struct alignas(16) Pack {
  scalar_t v[V];
};

template <typename scalar_t>
__global__ void gather_sum_vec_kernel(const scalar_t* rows, const int64_t* pos, const typename Acc<scalar_t>::type* w,
                                      int K, int64_t D, scalar_t* out) {
  using acc_t = typename Acc<scalar_t>::type;
  constexpr int V = 16 / sizeof(scalar_t);
  using P = Pack<scalar_t, V>;
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < D / V; i += blockDim.x) {
    acc_t acc[V];
    for (int j = 0; j < V; ++j) acc[j] = 0;
    for (int k = 0; k < K; ++k) {
      const int64_t p = pos[t * K + k];
      if (p < 0) continue;
      const acc_t wk = w ? w[t * K + k] : acc_t(1);
      const P in = reinterpret_cast<const P*>(rows + p * D)[i];
      for (int j = 0; j < V; ++j) acc[j] += wk * cvt<acc_t>(in.v[j]);
    }
    P o;
    for (int j = 0; j < V; ++j) o.v[j] = cvt<scalar_t>(acc[j]);
    reinterpret_cast<P*>(out + t * D)[i] = o;
  }
}

bool vec_ok(const void* a, const void* b, int64_t D, int64_t elt) {
  return reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0 && (D * elt) % 16 == 0;
}

// One warp per slot (t, k): gys[pos] = w * g[t] and gw[t, k] = <g[t], ys[pos]>, the row split
// among the lanes (16-byte packs where rows are aligned), the dot reduced by warp shuffles: no
// shared memory and no block barriers. Each covered row of gys is written by exactly one slot.
template <typename scalar_t>
__global__ void combine_backward_slots_kernel(const scalar_t* g, const scalar_t* ys, const int64_t* pos,
                                              const typename Acc<scalar_t>::type* w, int64_t S, int K, int64_t D,
                                              bool vec, scalar_t* gys, typename Acc<scalar_t>::type* gw) {
  using acc_t = typename Acc<scalar_t>::type;
  const int64_t s = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (s >= S) return;                       // a whole warp: s is the same on all its lanes
  const int64_t p = pos[s];
  if (p < 0) {                              // a dropped slot: no row, no weight gradient
    if (lane == 0) gw[s] = 0;
    return;
  }
  const acc_t wk = w[s];
  const scalar_t* g_row = g + (s / K) * D;
  acc_t dot = 0;
  if (vec) {
    constexpr int V = 16 / sizeof(scalar_t);
    using Pk = Pack<scalar_t, V>;
    const Pk* g_packs = reinterpret_cast<const Pk*>(g_row);
    const Pk* y_packs = reinterpret_cast<const Pk*>(ys + p * D);
    Pk* gy_packs = reinterpret_cast<Pk*>(gys + p * D);
    for (int64_t i = lane; i < D / V; i += 32) {
      const Pk gv = g_packs[i], yv = y_packs[i];
      Pk out;
      for (int j = 0; j < V; ++j) {
        const acc_t gd = cvt<acc_t>(gv.v[j]);
        dot += gd * cvt<acc_t>(yv.v[j]);
        out.v[j] = cvt<scalar_t>(wk * gd);
      }
      gy_packs[i] = out;
    }
  } else {
    dot = slot_backward<scalar_t, acc_t>(g_row, ys + p * D, wk, lane, 32, D, gys + p * D);
  }
  for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_down_sync(0xffffffffu, dot, offset);
  if (lane == 0) gw[s] = dot;
}

__global__ void mark_covered_kernel(const int64_t* pos, int64_t S, uint8_t* covered) {
  const int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (s < S) mark_covered(pos, s, s + 1, covered);
}

// One warp per permuted row; only the uncovered ones (padding, at most E * (block - 1) rows) write.
template <typename scalar_t>
__global__ void zero_uncovered_rows_kernel(const uint8_t* covered, int64_t P, int64_t D, scalar_t* gys) {
  const int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (r >= P || covered[r]) return;
  for (int64_t d = threadIdx.x % 32; d < D; d += 32) gys[r * D + d] = cvt<scalar_t>(typename Acc<scalar_t>::type(0));
}

}  // namespace

void launch_topk_gating(Dtype dt, const void* logits, int64_t T, int E, int K, bool renorm, const int64_t* forced,
                        void* w, int64_t* ids, cudaStream_t stream) {
  if (T == 0) return;
  HINTRL_DISPATCH(dt, topk_gating_kernel<scalar_t><<<blocks_for(T * 32), kThreads, 0, stream>>>(
                          static_cast<const scalar_t*>(logits), T, E, K, renorm, forced,
                          static_cast<typename Acc<scalar_t>::type*>(w), ids));
}

void launch_topk_gating_backward(Dtype dt, const void* gw, const void* logits, const int64_t* ids, int64_t T, int E,
                                 int K, bool renorm, void* glogits, cudaStream_t stream) {
  if (T == 0) return;
  HINTRL_DISPATCH(dt, topk_gating_backward_kernel<scalar_t><<<blocks_for(T * 32), kThreads, 0, stream>>>(
                          static_cast<const typename Acc<scalar_t>::type*>(gw), static_cast<const scalar_t*>(logits),
                          ids, T, E, K, renorm, static_cast<scalar_t*>(glogits)));
}

void launch_expert_counts(const int64_t* ids, int64_t S, int E, int block, int32_t* hist, int32_t* counts,
                          int32_t* offsets, cudaStream_t stream) {
  const int64_t C = (S + kCudaChunk - 1) / kCudaChunk;
  cudaMemsetAsync(hist, 0, sizeof(int32_t) * C * E, stream);
  if (C > 0) histogram_kernel<<<blocks_for(C), kThreads, 0, stream>>>(ids, S, C, E, hist);
  prefix_kernel<<<E, kThreads, 0, stream>>>(hist, C, E, counts);
  offsets_kernel<<<1, 1, 0, stream>>>(counts, E, block, offsets);
}

void launch_permute(Dtype dt, const void* x, const int64_t* ids, int64_t T, int K, int64_t D, int E,
                    const int32_t* offsets, int32_t* hist, int64_t* src, int64_t P, void* xs, int64_t* pos,
                    cudaStream_t stream) {
  const int64_t S = T * K, C = (S + kCudaChunk - 1) / kCudaChunk;
  cudaMemsetAsync(src, 0xff, sizeof(int64_t) * P, stream);  // all -1: padding rows
  if (C > 0) positions_kernel<<<blocks_for(C), kThreads, 0, stream>>>(ids, S, C, E, offsets, hist, pos, src);
  if (P == 0 || D == 0) return;
  // 16-byte words need 16-byte aligned rows: base pointers aligned and the row length a multiple.
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(xs) % 16 == 0;
  HINTRL_DISPATCH(dt, gather_rows_kernel<scalar_t><<<P, 128, 0, stream>>>(
                          static_cast<const scalar_t*>(x), src, K, D,
                          vec && (D * sizeof(scalar_t)) % 16 == 0, static_cast<scalar_t*>(xs)));
}

void launch_permute_backward(Dtype dt, const void* g, const int64_t* pos, int64_t T, int K, int64_t D, void* gx,
                             cudaStream_t stream) {
  if (T == 0 || D == 0) return;
  HINTRL_DISPATCH(dt, if (vec_ok(g, gx, D, sizeof(scalar_t))) {
    gather_sum_vec_kernel<scalar_t><<<T, 128, 0, stream>>>(static_cast<const scalar_t*>(g), pos, nullptr, K, D,
                                                           static_cast<scalar_t*>(gx));
  } else {
    combine_kernel<scalar_t><<<T, 128, 0, stream>>>(static_cast<const scalar_t*>(g), pos, nullptr, K, D,
                                                    static_cast<scalar_t*>(gx));
  });
}

void launch_unpermute_combine(Dtype dt, const void* ys, const int64_t* pos, const void* w, int64_t T, int K,
                              int64_t D, void* out, cudaStream_t stream) {
  if (T == 0 || D == 0) return;
  HINTRL_DISPATCH(dt, using acc_t = typename Acc<scalar_t>::type; if (vec_ok(ys, out, D, sizeof(scalar_t))) {
    gather_sum_vec_kernel<scalar_t><<<T, 128, 0, stream>>>(static_cast<const scalar_t*>(ys), pos,
                                                           static_cast<const acc_t*>(w), K, D,
                                                           static_cast<scalar_t*>(out));
  } else {
    combine_kernel<scalar_t><<<T, 128, 0, stream>>>(static_cast<const scalar_t*>(ys), pos,
                                                    static_cast<const acc_t*>(w), K, D, static_cast<scalar_t*>(out));
  });
}

void launch_unpermute_combine_backward(Dtype dt, const void* g, const void* ys, const int64_t* pos, const void* w,
                                       int64_t T, int K, int64_t D, int64_t P, uint8_t* covered, void* gys, void* gw,
                                       cudaStream_t stream) {
  const int64_t S = T * K;
  if (P > 0) {
    cudaMemsetAsync(covered, 0, P, stream);
    if (S > 0) mark_covered_kernel<<<blocks_for(S), kThreads, 0, stream>>>(pos, S, covered);
  }
  HINTRL_DISPATCH(dt, using acc_t = typename Acc<scalar_t>::type;
    if (S > 0) combine_backward_slots_kernel<scalar_t><<<blocks_for(S * 32), kThreads, 0, stream>>>(
        static_cast<const scalar_t*>(g), static_cast<const scalar_t*>(ys), pos, static_cast<const acc_t*>(w), S, K,
        D, vec_ok(g, ys, D, sizeof(scalar_t)) && reinterpret_cast<uintptr_t>(gys) % 16 == 0,
        static_cast<scalar_t*>(gys), static_cast<acc_t*>(gw));
    if (P > 0 && D > 0) zero_uncovered_rows_kernel<scalar_t><<<blocks_for(P * 32), kThreads, 0, stream>>>(
        covered, P, D, static_cast<scalar_t*>(gys)););
}

}  // namespace hintrl
