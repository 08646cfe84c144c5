// Index logic of the MoE routing ops, shared verbatim by the CPU build (moe_cpu.cpp) and the CUDA
// build (moe_cuda.cu): raw pointers, no torch types, so both compilers see the same code and the
// CPU tests exercise what the GPU runs.
//
// Shape legend: T tokens, E experts, K routed slots per token, S = T*K slots (slot s = t*K + k),
// D hidden width, C chunks of slots, P permuted rows (S plus block padding).
//
// Conventions the ops rely on:
//  * top-k order: higher logit first, lower expert id on ties (so the result is deterministic and a
//    stable descending sort in PyTorch reproduces it exactly);
//  * an id outside [0, E) is a dropped slot (transformers' expert-parallel sentinel convention): it
//    gets no row, position -1, and contributes zero;
//  * permuted order is stable: rows of one expert keep increasing slot order.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define HINTRL_HD __host__ __device__ __forceinline__
#else
#define HINTRL_HD inline
#include <cmath>
#endif

namespace hintrl {

// Dtype conversion hook: the default cast suits float/double/c10 types; the CUDA file specialises it
// for __half/__nv_bfloat16 because torch builds with their implicit conversions disabled.
template <typename To, typename From>
HINTRL_HD To cvt(From x) { return static_cast<To>(x); }

HINTRL_HD double exp_acc(double x) { return exp(x); }
HINTRL_HD float exp_acc(float x) { return expf(x); }

HINTRL_HD bool ranks_before(double a, int ia, double b, int ib) {
  return a > b || (a == b && ia < ib);
}

// Each row function below is built from pieces over a strided part of the row, e = first,
// first + step, ... < E: the CPU runs every piece over the whole row (first 0, step 1); a CUDA warp
// gives each lane its part (first = lane, step = 32) and combines the lanes' results by shuffles
// (moe_cuda.cu), so both builds run the same per-element code.

// The largest logit of a part (-inf for an empty part).
template <typename scalar_t, typename acc_t>
HINTRL_HD acc_t part_max(const scalar_t* logits_E, int first, int step, int E) {
  acc_t mx = -acc_t(INFINITY);
  for (int e = first; e < E; e += step) {
    acc_t v = cvt<acc_t>(logits_E[e]);
    mx = v > mx ? v : mx;
  }
  return mx;
}

// sum over a part of exp(l_e - mx).
template <typename scalar_t, typename acc_t>
HINTRL_HD acc_t part_exp_sum(const scalar_t* logits_E, int first, int step, int E, acc_t mx) {
  acc_t sum = 0;
  for (int e = first; e < E; e += step) sum += exp_acc(cvt<acc_t>(logits_E[e]) - mx);
  return sum;
}

// A row's softmax in two numbers: its max logit and sum_e exp(l_e - max), so p_e = exp(l_e - max) / denom.
template <typename scalar_t, typename acc_t>
HINTRL_HD void softmax_stats(const scalar_t* logits_E, int E, acc_t& mx, acc_t& denom) {
  mx = part_max<scalar_t, acc_t>(logits_E, 0, 1, E);
  denom = part_exp_sum<scalar_t, acc_t>(logits_E, 0, 1, E, mx);
}

// Of the experts in a part that rank after (prev_v, prev) (any, when prev < 0), the first-ranked:
// best = -1 when there is none. Ranking is total (logit, then lower id), so the best of the parts'
// bests is the row's, whatever the split.
template <typename scalar_t, typename acc_t>
HINTRL_HD void part_best_after(const scalar_t* logits_E, int first, int step, int E, int prev, acc_t prev_v,
                               int& best, acc_t& best_v) {
  best = -1;
  best_v = 0;
  for (int e = first; e < E; e += step) {
    acc_t v = cvt<acc_t>(logits_E[e]);
    bool after_prev = prev < 0 || ranks_before(prev_v, prev, v, e);
    if (after_prev && (best < 0 || ranks_before(v, e, best_v, best))) { best = e; best_v = v; }
  }
}

// Slot k of a row whose selection is done: the id and its probability (a forced id outside [0, E)
// is a dropped slot: no probability mass, no gradient).
template <typename scalar_t, typename acc_t>
HINTRL_HD void write_slot(const scalar_t* logits_E, int E, int64_t id, acc_t mx, acc_t denom, acc_t* w, int64_t* out_id) {
  *out_id = id;
  *w = (id < 0 || id >= E) ? acc_t(0) : exp_acc(cvt<acc_t>(logits_E[id]) - mx) / denom;
}

template <typename acc_t>
HINTRL_HD void renormalise(acc_t* w_K, int K) {
  acc_t s = 0;
  for (int k = 0; k < K; ++k) s += w_K[k];
  for (int k = 0; k < K; ++k) w_K[k] /= s;
}

// One token row of top-k gating: softmax(logits_E) in acc_t, then either select the top K experts or
// take forced_K (router replay) as given; w_K are the probabilities at the chosen ids, renormalised
// over the K slots when asked. O(K*E) selection needs no scratch memory, which matters on the GPU.
template <typename scalar_t, typename acc_t>
HINTRL_HD void topk_gating_row(const scalar_t* logits_E, int E, int K, bool renorm,
                               const int64_t* forced_K, acc_t* w_K, int64_t* ids_K) {
  acc_t mx, denom;
  softmax_stats(logits_E, E, mx, denom);
  int prev = -1;
  acc_t prev_v = 0;
  for (int k = 0; k < K; ++k) {
    if (forced_K != nullptr) {
      write_slot(logits_E, E, forced_K[k], mx, denom, w_K + k, ids_K + k);
      continue;
    }
    part_best_after<scalar_t, acc_t>(logits_E, 0, 1, E, prev, prev_v, prev, prev_v);
    write_slot(logits_E, E, int64_t(prev), mx, denom, w_K + k, ids_K + k);
  }
  if (renorm) renormalise(w_K, K);
}

// Gradient of topk_gating_row w.r.t. the logits (ids are constants). With p = softmax(l) and
// dp_k = dL/dp[id_k]: dL/dl_e = p_e * (sum_{k: id_k = e} dp_k - sum_k dp_k p[id_k]).
template <typename scalar_t, typename acc_t>
HINTRL_HD acc_t prob_at(const scalar_t* logits_E, int E, int64_t id, acc_t mx, acc_t denom) {
  return (id < 0 || id >= E) ? acc_t(0) : exp_acc(cvt<acc_t>(logits_E[id]) - mx) / denom;
}

// The row's terms of that gradient that do not depend on e: dp_k (written over gw_K's copy dp_K)
// and c = sum_k dp_k p[id_k].
template <typename scalar_t, typename acc_t>
HINTRL_HD acc_t gating_grad_terms(const acc_t* gw_K, const scalar_t* logits_E, const int64_t* ids_K, int E, int K,
                                  bool renorm, acc_t mx, acc_t denom, acc_t* dp_K) {
  acc_t psum = 0, gw_dot_w = 0;
  for (int k = 0; k < K; ++k) psum += prob_at(logits_E, E, ids_K[k], mx, denom);
  if (renorm)
    for (int k = 0; k < K; ++k)
      gw_dot_w += gw_K[k] * prob_at(logits_E, E, ids_K[k], mx, denom) / psum;
  acc_t c = 0;
  for (int k = 0; k < K; ++k) {
    dp_K[k] = renorm ? (gw_K[k] - gw_dot_w) / psum : gw_K[k];
    c += dp_K[k] * prob_at(logits_E, E, ids_K[k], mx, denom);
  }
  return c;
}

// dL/dl_e for the experts of a part.
template <typename scalar_t, typename acc_t>
HINTRL_HD void part_gating_grad(const scalar_t* logits_E, const int64_t* ids_K, const acc_t* dp_K, int first,
                                int step, int E, int K, acc_t mx, acc_t denom, acc_t c, scalar_t* glogits_E) {
  for (int e = first; e < E; e += step) {
    acc_t p = exp_acc(cvt<acc_t>(logits_E[e]) - mx) / denom;
    acc_t g = -c;
    for (int k = 0; k < K; ++k)
      if (ids_K[k] == e) g += dp_K[k];
    glogits_E[e] = cvt<scalar_t>(p * g);
  }
}

// K is at most this in the backward's per-row scratch (dp_K): the routers here use K <= 16.
constexpr int kMaxTopK = 32;

template <typename scalar_t, typename acc_t>
HINTRL_HD void topk_gating_backward_row(const acc_t* gw_K, const scalar_t* logits_E, const int64_t* ids_K,
                                        int E, int K, bool renorm, scalar_t* glogits_E) {
  acc_t mx, denom, dp_K[kMaxTopK];
  softmax_stats(logits_E, E, mx, denom);
  const acc_t c = gating_grad_terms(gw_K, logits_E, ids_K, E, K, renorm, mx, denom, dp_K);
  part_gating_grad(logits_E, ids_K, dp_K, 0, 1, E, K, mx, denom, c, glogits_E);
}

// Counting sort in three data-parallel passes over chunks of slots; hist_CE is row-major [C][E] and
// zeroed by the caller. Pass 1: per-chunk histogram.
HINTRL_HD void chunk_histogram(const int64_t* ids_S, int64_t begin, int64_t end, int E, int32_t* hist_E) {
  for (int64_t s = begin; s < end; ++s) {
    int64_t e = ids_S[s];
    if (e >= 0 && e < E) hist_E[e] += 1;
  }
}

// Pass 2a (one call per expert e): turn column e of hist_CE into an exclusive prefix over chunks,
// and write the expert's total.
HINTRL_HD void expert_prefix(int32_t* hist_CE, int64_t C, int E, int e, int32_t* counts_E) {
  int32_t run = 0;
  for (int64_t c = 0; c < C; ++c) {
    int32_t h = hist_CE[c * E + e];
    hist_CE[c * E + e] = run;
    run += h;
  }
  counts_E[e] = run;
}

// Pass 2b (serial, E is small): offsets_E1[e] is where expert e's rows start; each group is padded
// up to a multiple of block so block-tiled GEMMs never straddle two experts.
HINTRL_HD void offsets_from_counts(const int32_t* counts_E, int E, int block, int32_t* offsets_E1) {
  int32_t run = 0;
  offsets_E1[0] = 0;
  for (int e = 0; e < E; ++e) {
    run += (counts_E[e] + block - 1) / block * block;
    offsets_E1[e + 1] = run;
  }
}

// Pass 3: walk the chunk in slot order again and hand out rows; scanning in order is what makes the
// permutation stable without a sort. base_E is this chunk's row of the prefixed hist_CE.
HINTRL_HD void chunk_positions(const int64_t* ids_S, int64_t begin, int64_t end, int E,
                               const int32_t* offsets_E1, int32_t* base_E, int64_t* pos_S) {
  for (int64_t s = begin; s < end; ++s) {
    int64_t e = ids_S[s];
    if (e >= 0 && e < E) {
      pos_S[s] = offsets_E1[e] + base_E[e];
      base_E[e] += 1;
    } else {
      pos_S[s] = -1;
    }
  }
}

// The combine's backward for one slot whose row is y_D (weight w, output gradient g_D), over the
// elements d = first, first + step, ... < D: writes gy_D[d] = w * g_D[d] and returns those
// elements' share of the weight gradient sum_d g_D[d] * y_D[d]. The CPU calls it once per slot
// (first 0, step 1); a CUDA warp splits the row among its lanes (first = lane, step = 32).
template <typename scalar_t, typename acc_t>
HINTRL_HD acc_t slot_backward(const scalar_t* g_D, const scalar_t* y_D, acc_t w, int64_t first, int64_t step,
                              int64_t D, scalar_t* gy_D) {
  acc_t dot = 0;
  for (int64_t d = first; d < D; d += step) {
    const acc_t gd = cvt<acc_t>(g_D[d]);
    dot += gd * cvt<acc_t>(y_D[d]);
    gy_D[d] = cvt<scalar_t>(w * gd);
  }
  return dot;
}

// Marks the permuted rows some slot in [begin, end) points at. The rest (block padding, dropped
// slots) are the only rows the combine's backward must zero: each covered row is written by
// exactly one slot, so no zero fill of all P rows is needed.
HINTRL_HD void mark_covered(const int64_t* pos_S, int64_t begin, int64_t end, uint8_t* covered_P) {
  for (int64_t s = begin; s < end; ++s)
    if (pos_S[s] >= 0) covered_P[pos_S[s]] = 1;
}

// Largest P the ops may need: every expert can waste block-1 padding rows. Static, so the fake
// (meta) implementations know output shapes without looking at data.
HINTRL_HD int64_t permuted_rows(int64_t S, int E, int block) { return S + int64_t(E) * (block - 1); }

}  // namespace hintrl
