// Decode attention on the CPU, fused: one new token per row. Per-head RMS norm of queries and keys
// (Qwen3; skipped without weights), rotary embedding, the new key/value written into the row's cache
// at `length`, then every query head attending over the row's length+1 cached keys, with GQA (query
// head i reads key/value head i / (H / Hkv), transformers' repeat_kv order). Schema in
// moe_bindings.cpp; used by student/lean.py for decoding (no autograd).
//
// Why: written as tensor ops this is ~120 ATen calls per layer and decode step, and at decode shapes
// (64 rows x 4 heads x <= 32 keys x 32 dims) their dispatch cost dwarfs the arithmetic.
// Arithmetic follows the tensor-op version step by step in fp32 (norm, then rotation, then
// scores x scale + bias, max-subtracted softmax, weighted sum); only summation order differs.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

namespace hintrl {
namespace {

// One head of width d: optional RMS norm (weight w), then rotation by (cos, sin) into out.
// rotate_half(y) = (-y[d/2:], y[:d/2]).
inline void norm_rotate(const float* x, const float* w, float eps, const float* cos, const float* sin,
                        int64_t d, float* y, float* out) {
  if (w != nullptr) {
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t e = 0; e < d; ++e) ss += x[e] * x[e];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(d) + eps);
    for (int64_t e = 0; e < d; ++e) y[e] = w[e] * (x[e] * inv);
  } else {
    for (int64_t e = 0; e < d; ++e) y[e] = x[e];
  }
  const int64_t half = d / 2;
  for (int64_t e = 0; e < half; ++e) out[e] = y[e] * cos[e] + (-y[e + half]) * sin[e];
  for (int64_t e = half; e < d; ++e) out[e] = y[e] * cos[e] + y[e - half] * sin[e];
}

at::Tensor decode_attention_cpu(const at::Tensor& qkv_NJd, const std::optional<at::Tensor>& norm_w,
                                const at::Tensor& cos_Nd, const at::Tensor& sin_Nd, at::Tensor& k_cache,
                                at::Tensor& v_cache, int64_t length, const at::Tensor& bias_NT, double scale,
                                double eps) {
  const char* what = "decode_attention";
  const std::initializer_list<const at::Tensor*> all = {&qkv_NJd, &cos_Nd, &sin_Nd, &k_cache, &v_cache, &bias_NT};
  for (const at::Tensor* t : all) {
    TORCH_CHECK(t->device().is_cpu(), what, ": the CPU kernel got a tensor on ", t->device());
    TORCH_CHECK(t->scalar_type() == at::kFloat, what, ": fp32 only, got ", t->scalar_type());
  }
  TORCH_CHECK(qkv_NJd.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), what,
              ": expected qkv (N, H + 2 Hkv, d) and caches (N, Hkv, capacity, d), got ", qkv_NJd.sizes(), ", ",
              k_cache.sizes(), ", ", v_cache.sizes());
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), what, ": caches must be contiguous");
  const int64_t N = qkv_NJd.size(0), d = qkv_NJd.size(2), Hkv = k_cache.size(1), cap = k_cache.size(2);
  const int64_t H = qkv_NJd.size(1) - 2 * Hkv, T = length + 1;
  TORCH_CHECK(k_cache.size(0) == N && k_cache.size(3) == d && d % 2 == 0, what, ": caches ", k_cache.sizes(),
              " do not fit qkv ", qkv_NJd.sizes(), " (head width must be even)");
  TORCH_CHECK(H > 0 && H % Hkv == 0, what, ": ", H, " query heads do not group over ", Hkv, " key/value heads");
  TORCH_CHECK(length >= 0 && length < cap, what, ": length ", length, " outside the cache capacity ", cap);
  TORCH_CHECK(cos_Nd.sizes() == sin_Nd.sizes() && cos_Nd.dim() == 2 && cos_Nd.size(0) == N && cos_Nd.size(1) == d,
              what, ": cos and sin must be (N, d) = (", N, ", ", d, "), got ", cos_Nd.sizes(), " and ", sin_Nd.sizes());
  TORCH_CHECK(bias_NT.dim() == 2 && bias_NT.size(0) == N && bias_NT.size(1) == T, what,
              ": bias must be (N, length + 1) = (", N, ", ", T, "), got ", bias_NT.sizes());
  at::Tensor w;
  if (norm_w.has_value()) {
    w = norm_w->contiguous();
    TORCH_CHECK(w.scalar_type() == at::kFloat && w.device().is_cpu() && w.dim() == 2 && w.size(0) == H + Hkv &&
                    w.size(1) == d,
                what, ": norm weight must be fp32 (H + Hkv, d) = (", H + Hkv, ", ", d, "), got ", w.sizes());
  }
  const at::Tensor qkv = qkv_NJd.contiguous(), cos = cos_Nd.contiguous(), sin = sin_Nd.contiguous();
  const at::Tensor bias = bias_NT.contiguous();
  auto out = at::empty({N, H * d}, qkv.options());

  const float* q_ptr = qkv.data_ptr<float>();
  const float* w_ptr = w.defined() ? w.data_ptr<float>() : nullptr;
  const float *c_ptr = cos.data_ptr<float>(), *s_ptr = sin.data_ptr<float>(), *b_ptr = bias.data_ptr<float>();
  float *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>(), *o_ptr = out.data_ptr<float>();
  const int64_t G = H / Hkv, J = H + 2 * Hkv;
  const float sc = static_cast<float>(scale), ep = static_cast<float>(eps);
  // Rows per task: ATen's 32768-element grain over the attention work of a row.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, H * T * d));
  at::parallel_for(0, N, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> qk((H + Hkv) * d), tmp(d), p(T);
    for (int64_t r = r0; r < r1; ++r) {
      const float* src = q_ptr + r * J * d;
      for (int64_t j = 0; j < H + Hkv; ++j)
        norm_rotate(src + j * d, w_ptr ? w_ptr + j * d : nullptr, ep, c_ptr + r * d, s_ptr + r * d, d, tmp.data(),
                    qk.data() + j * d);
      for (int64_t j = 0; j < Hkv; ++j) {
        float* kdst = kc + ((r * Hkv + j) * cap + length) * d;
        float* vdst = vc + ((r * Hkv + j) * cap + length) * d;
        const float* knew = qk.data() + (H + j) * d;
        const float* vnew = src + (H + Hkv + j) * d;
        for (int64_t e = 0; e < d; ++e) { kdst[e] = knew[e]; vdst[e] = vnew[e]; }
      }
      const float* brow = b_ptr + r * T;
      for (int64_t i = 0; i < H; ++i) {
        const float* q = qk.data() + i * d;
        const float* K = kc + (r * Hkv + i / G) * cap * d;
        const float* V = vc + (r * Hkv + i / G) * cap * d;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < T; ++t) {
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int64_t e = 0; e < d; ++e) dot += q[e] * K[t * d + e];
          p[t] = dot * sc + brow[t];
          m = std::max(m, p[t]);
        }
        float total = 0.f;
        for (int64_t t = 0; t < T; ++t) { p[t] = std::exp(p[t] - m); total += p[t]; }
        float* o = o_ptr + (r * H + i) * d;
        for (int64_t e = 0; e < d; ++e) o[e] = 0.f;
        for (int64_t t = 0; t < T; ++t) {
          const float pt = p[t] / total;
#pragma omp simd
          for (int64_t e = 0; e < d; ++e) o[e] += pt * V[t * d + e];
        }
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(hintrl, CPU, m) { m.impl("decode_attention", &decode_attention_cpu); }

}  // namespace hintrl
