// CPU implementation of the hintrl MoE routing ops: shape/dtype checks, then the index logic of
// moe_core.h driven by at::parallel_for. Schemas live in moe_bindings.cpp.
// Shape legend: see moe_core.h (T, E, K, S = T*K, D, C, P).
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "moe_core.h"
#include "small_gemm_cpu.h"

namespace hintrl {
namespace {

void check_ids(const at::Tensor& ids_TK, const char* what) {
  TORCH_CHECK(ids_TK.dim() == 2, what, ": expected ids of shape (T, K), got ", ids_TK.sizes());
  TORCH_CHECK(ids_TK.scalar_type() == at::kLong, what, ": ids must be int64, got ", ids_TK.scalar_type());
}

void check_cpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), what, ": the CPU kernel got a tensor on ", t.device());
}

at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// Work per parallel task, in elements, as ATen's own kernels do: entering an OpenMP region costs
// microseconds on idle cores and milliseconds on cores shared with other jobs, so small ops stay serial.
constexpr int64_t kGrain = 32768;
int64_t rows_grain(int64_t work_per_row) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, work_per_row)); }

// Chunks of the counting sort: one (serial) below a few grains of slots, else a few per thread.
int64_t num_chunks(int64_t S) {
  if (S < 4 * kGrain) return 1;
  return std::min<int64_t>(S / kGrain, 4 * at::get_num_threads());
}

std::tuple<at::Tensor, at::Tensor> topk_gating_cpu(const at::Tensor& logits_TE, int64_t k, bool renorm,
                                                  const std::optional<at::Tensor>& forced_TK) {
  TORCH_CHECK(logits_TE.dim() == 2, "topk_gating: logits must be (T, E), got ", logits_TE.sizes());
  check_cpu(logits_TE, "topk_gating");
  const int64_t T = logits_TE.size(0), E = logits_TE.size(1);
  TORCH_CHECK(k >= 1 && k <= E, "topk_gating: need 1 <= k <= E, got k=", k, " E=", E);
  TORCH_CHECK(k <= kMaxTopK, "topk_gating: k=", k, " is above the ", kMaxTopK, " slots per row the kernels hold");
  at::Tensor logits = logits_TE.contiguous();
  at::Tensor forced;
  if (forced_TK.has_value()) {
    forced = forced_TK->contiguous();
    check_ids(forced, "topk_gating(forced_ids)");
    check_cpu(forced, "topk_gating");
    TORCH_CHECK(forced.size(0) == T && forced.size(1) == k, "topk_gating: forced_ids must be (T, k) = (", T, ", ",
                k, "), got ", forced.sizes());
  }
  auto w_TK = at::empty({T, k}, logits.options().dtype(acc_type(logits.scalar_type())));
  auto ids_TK = at::empty({T, k}, logits.options().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "topk_gating_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* l = logits.data_ptr<scalar_t>();
    const int64_t* f = forced.defined() ? forced.data_ptr<int64_t>() : nullptr;
    acc_t* w = w_TK.data_ptr<acc_t>();
    int64_t* ids = ids_TK.data_ptr<int64_t>();
    at::parallel_for(0, T, rows_grain(E * k), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t)
        topk_gating_row<scalar_t, acc_t>(l + t * E, E, k, renorm, f ? f + t * k : nullptr, w + t * k, ids + t * k);
    });
  });
  return {w_TK, ids_TK};
}

at::Tensor topk_gating_backward_cpu(const at::Tensor& grad_w_TK, const at::Tensor& logits_TE,
                                    const at::Tensor& ids_TK, bool renorm) {
  check_cpu(logits_TE, "topk_gating_backward");
  check_ids(ids_TK, "topk_gating_backward");
  const int64_t T = logits_TE.size(0), E = logits_TE.size(1), K = ids_TK.size(1);
  TORCH_CHECK(K <= kMaxTopK, "topk_gating_backward: k=", K, " is above the ", kMaxTopK, " slots per row the kernels hold");
  at::Tensor logits = logits_TE.contiguous(), ids = ids_TK.contiguous();
  at::Tensor gw = grad_w_TK.to(acc_type(logits.scalar_type())).contiguous();
  auto glogits_TE = at::empty_like(logits);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "topk_gating_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* l = logits.data_ptr<scalar_t>();
    const acc_t* g = gw.data_ptr<acc_t>();
    const int64_t* i = ids.data_ptr<int64_t>();
    scalar_t* out = glogits_TE.data_ptr<scalar_t>();
    at::parallel_for(0, T, rows_grain(E * K), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t)
        topk_gating_backward_row<scalar_t, acc_t>(g + t * K, l + t * E, i + t * K, E, K, renorm, out + t * E);
    });
  });
  return glogits_TE;
}

// Histogram + per-expert prefix over chunks; leaves hist_CE holding each chunk's first row per expert.
void count_chunks(const int64_t* ids, int64_t S, int64_t E, int64_t C, int32_t* hist_CE, int32_t* counts_E) {
  const int64_t per = (S + C - 1) / C;
  at::parallel_for(0, C, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c)
      chunk_histogram(ids, std::min(S, c * per), std::min(S, (c + 1) * per), E, hist_CE + c * E);
  });
  for (int64_t e = 0; e < E; ++e) expert_prefix(hist_CE, C, E, e, counts_E);
}

std::tuple<at::Tensor, at::Tensor> expert_counts_cpu(const at::Tensor& ids_TK, int64_t E, int64_t block) {
  check_ids(ids_TK, "expert_counts");
  check_cpu(ids_TK, "expert_counts");
  TORCH_CHECK(E >= 1 && block >= 1, "expert_counts: need num_experts >= 1 and block >= 1");
  at::Tensor ids = ids_TK.contiguous();
  const int64_t S = ids.numel();
  auto counts_E = at::empty({E}, ids.options().dtype(at::kInt));
  auto offsets_E1 = at::empty({E + 1}, ids.options().dtype(at::kInt));
  const int64_t C = num_chunks(S);
  std::vector<int32_t> hist(C * E, 0);
  count_chunks(ids.data_ptr<int64_t>(), S, E, C, hist.data(), counts_E.data_ptr<int32_t>());
  offsets_from_counts(counts_E.data_ptr<int32_t>(), E, block, offsets_E1.data_ptr<int32_t>());
  return {counts_E, offsets_E1};
}

std::tuple<at::Tensor, at::Tensor> permute_cpu(const at::Tensor& x_TD, const at::Tensor& ids_TK,
                                               const at::Tensor& offsets_E1, int64_t block) {
  check_ids(ids_TK, "permute");
  check_cpu(x_TD, "permute");
  check_cpu(ids_TK, "permute");
  TORCH_CHECK(x_TD.dim() == 2 && x_TD.size(0) == ids_TK.size(0), "permute: x must be (T, D) with T = ids.size(0)");
  TORCH_CHECK(offsets_E1.dim() == 1 && offsets_E1.scalar_type() == at::kInt && offsets_E1.size(0) >= 2,
              "permute: offsets must be int32 of shape (E+1,)");
  at::Tensor x = x_TD.contiguous(), ids = ids_TK.contiguous(), offsets = offsets_E1.contiguous();
  const int64_t T = x.size(0), D = x.size(1), K = ids.size(1), S = T * K, E = offsets.size(0) - 1;
  const int64_t P = permuted_rows(S, E, block);
  const int32_t* off = offsets.data_ptr<int32_t>();
  TORCH_CHECK(off[E] <= P, "permute: offsets do not match ids/block (offsets[-1]=", off[E], " > ", P, ")");
  auto pos_TK = at::empty({T, K}, ids.options());
  const int64_t C = num_chunks(S);
  std::vector<int32_t> hist(C * E, 0), counts(E);
  const int64_t* idp = ids.data_ptr<int64_t>();
  count_chunks(idp, S, E, C, hist.data(), counts.data());
  // Offsets from other ids would send rows past the end of xs: check they hold these ids' groups.
  for (int64_t e = 0; e < E; ++e)
    TORCH_CHECK(off[e] >= 0 && off[e + 1] - off[e] >= counts[e], "permute: offsets do not fit ids (expert ", e,
                " has ", counts[e], " slots, offsets give ", off[e + 1] - off[e], "); use expert_counts(ids)");
  int64_t* pos = pos_TK.data_ptr<int64_t>();
  const int64_t per = (S + C - 1) / C;
  at::parallel_for(0, C, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c)
      chunk_positions(idp, std::min(S, c * per), std::min(S, (c + 1) * per), E, off, hist.data() + c * E, pos);
  });
  // Row -> slot map, so every output row (padding included) is written exactly once.
  std::vector<int64_t> src_P(P, -1);
  for (int64_t s = 0; s < S; ++s)
    if (pos[s] >= 0) src_P[pos[s]] = s;
  auto xs_PD = at::empty({P, D}, x.options());
  const int64_t row_bytes = D * x.element_size();
  const char* xp = static_cast<const char*>(x.data_ptr());
  char* out = static_cast<char*>(xs_PD.data_ptr());
  at::parallel_for(0, P, rows_grain(D), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      if (src_P[r] >= 0) std::memcpy(out + r * row_bytes, xp + (src_P[r] / K) * row_bytes, row_bytes);
      else std::memset(out + r * row_bytes, 0, row_bytes);
    }
  });
  return {xs_PD, pos_TK};
}

// out[t] = sum over token t's K slots of w[t, k] * src[pos[t, k]] (w = nullptr: weight 1), in acc_t;
// slots with pos < 0 (dropped) add nothing. unpermute_combine's forward, and permute's backward.
template <typename scalar_t, typename acc_t>
void sum_slot_rows(const scalar_t* src_PD, const int64_t* pos_TK, const acc_t* w_TK, int64_t T, int64_t K,
                   int64_t D, scalar_t* out_TD) {
  at::parallel_for(0, T, rows_grain(D * K), [&](int64_t b, int64_t e) {
    std::vector<acc_t> acc(D);
    for (int64_t t = b; t < e; ++t) {
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t k = 0; k < K; ++k) {
        const int64_t p = pos_TK[t * K + k];
        if (p < 0) continue;
        const acc_t wk = w_TK == nullptr ? acc_t(1) : w_TK[t * K + k];
        const scalar_t* row = src_PD + p * D;
        for (int64_t d = 0; d < D; ++d) acc[d] += wk * static_cast<acc_t>(row[d]);
      }
      for (int64_t d = 0; d < D; ++d) out_TD[t * D + d] = static_cast<scalar_t>(acc[d]);
    }
  });
}

at::Tensor permute_backward_cpu(const at::Tensor& grad_xs_PD, const at::Tensor& pos_TK) {
  check_cpu(grad_xs_PD, "permute_backward");
  check_ids(pos_TK, "permute_backward");
  at::Tensor g = grad_xs_PD.contiguous(), pos = pos_TK.contiguous();
  const int64_t T = pos.size(0), K = pos.size(1), D = g.size(1);
  auto gx_TD = at::empty({T, D}, g.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, g.scalar_type(), "permute_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    sum_slot_rows<scalar_t, acc_t>(g.data_ptr<scalar_t>(), pos.data_ptr<int64_t>(), nullptr, T, K, D,
                                   gx_TD.data_ptr<scalar_t>());
  });
  return gx_TD;
}

at::Tensor unpermute_combine_cpu(const at::Tensor& ys_PD, const at::Tensor& pos_TK, const at::Tensor& w_TK) {
  check_cpu(ys_PD, "unpermute_combine");
  check_ids(pos_TK, "unpermute_combine");
  TORCH_CHECK(w_TK.sizes() == pos_TK.sizes(), "unpermute_combine: weights ", w_TK.sizes(), " != pos ", pos_TK.sizes());
  TORCH_CHECK(ys_PD.dim() == 2, "unpermute_combine: ys must be (P, D)");
  at::Tensor ys = ys_PD.contiguous(), pos = pos_TK.contiguous();
  const int64_t T = pos.size(0), K = pos.size(1), D = ys.size(1);
  at::Tensor w = w_TK.to(acc_type(ys.scalar_type())).contiguous();
  auto out_TD = at::empty({T, D}, ys.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, ys.scalar_type(), "unpermute_combine_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    sum_slot_rows<scalar_t, acc_t>(ys.data_ptr<scalar_t>(), pos.data_ptr<int64_t>(), w.data_ptr<acc_t>(), T, K, D,
                                   out_TD.data_ptr<scalar_t>());
  });
  return out_TD;
}

std::tuple<at::Tensor, at::Tensor> unpermute_combine_backward_cpu(const at::Tensor& grad_out_TD, const at::Tensor& ys_PD,
                                                                  const at::Tensor& pos_TK, const at::Tensor& w_TK) {
  check_cpu(ys_PD, "unpermute_combine_backward");
  check_ids(pos_TK, "unpermute_combine_backward");
  at::Tensor ys = ys_PD.contiguous(), pos = pos_TK.contiguous(), g = grad_out_TD.to(ys.scalar_type()).contiguous();
  const int64_t T = pos.size(0), K = pos.size(1), D = ys.size(1), P = ys.size(0);
  at::Tensor w = w_TK.to(acc_type(ys.scalar_type())).contiguous();
  auto gys_PD = at::empty({P, D}, ys.options());
  auto gw_TK = at::empty({T, K}, w.options());
  // Rows no slot points at (padding, dropped slots) must read as zero gradient.
  std::vector<uint8_t> covered(P, 0);
  const int64_t* pp = pos.data_ptr<int64_t>();
  mark_covered(pp, 0, T * K, covered.data());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, ys.scalar_type(), "unpermute_combine_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* yp = ys.data_ptr<scalar_t>();
    const scalar_t* gp = g.data_ptr<scalar_t>();
    const acc_t* wp = w.data_ptr<acc_t>();
    scalar_t* gyp = gys_PD.data_ptr<scalar_t>();
    acc_t* gwp = gw_TK.data_ptr<acc_t>();
    at::parallel_for(0, P, rows_grain(D), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        if (!covered[r]) std::fill(gyp + r * D, gyp + (r + 1) * D, scalar_t(0));
    });
    at::parallel_for(0, T, rows_grain(D * K), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const scalar_t* grow = gp + t * D;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t p = pp[t * K + k];
          if (p < 0) { gwp[t * K + k] = 0; continue; }
          gwp[t * K + k] = slot_backward<scalar_t, acc_t>(grow, yp + p * D, wp[t * K + k], 0, 1, D, gyp + p * D);
        }
      }
    });
  });
  return {gys_PD, gw_TK};
}

// Grouped GEMM, CPU: one product per expert (BLAS, or small_gemm_cpu.h for experts with few rows),
// the experts spread over the threads.
// Why not torch's grouped GEMM: it runs the experts one after another and lets BLAS thread each
// small product, which at RL decode shapes (~16 rows per expert) leaves the other cores idle.
// Here each call is single-threaded (BLAS inside an OpenMP region runs serially) and the experts
// are the parallelism. The split is per expert, never by the thread count, so results do not
// depend on it: every output element is the same dot product whichever thread computes it.
void check_grouped(const at::Tensor& x_PI, const at::Tensor& w_EIO, const at::Tensor& offsets_E1, int64_t E,
                   const char* what) {
  check_cpu(x_PI, what);
  check_cpu(w_EIO, what);
  check_cpu(offsets_E1, what);  // read on the host below
  TORCH_CHECK(x_PI.dim() == 2, what, ": x must be (P, I), got ", x_PI.sizes());
  TORCH_CHECK(offsets_E1.dim() == 1 && offsets_E1.scalar_type() == at::kInt && offsets_E1.size(0) == E + 1,
              what, ": offsets must be int32 of shape (E+1,) = (", E + 1, ",), got ", offsets_E1.sizes());
  const int32_t* off = offsets_E1.data_ptr<int32_t>();
  TORCH_CHECK(off[0] == 0 && off[E] <= x_PI.size(0), what, ": offsets must run from 0 to at most P = ",
              x_PI.size(0), ", got ", off[0], "..", off[E]);
  for (int64_t e = 0; e < E; ++e) TORCH_CHECK(off[e + 1] >= off[e], what, ": offsets must not decrease");
}

// The experts dealt to `bins` threads by rows, largest first to the least loaded (LPT). A trained
// router is skewed: after the default experiment's warm-start the 8 experts of a layer got 1046,
// 919, 506, 209, 147, 166, 108 and 355 rows, and handing each thread a contiguous run of experts
// gave one thread 2680 rows and the other 776. Experts stay whole, so every expert's product is the
// same call whatever the thread count (results do not depend on it). Warm-start step of the default
// experiment, A/B: 0.117 -> 0.115 s (its experts are narrow); decoding's near-even routing: no change.
std::vector<std::vector<int64_t>> deal_experts(const int32_t* off, int64_t E, int64_t bins) {
  std::vector<int64_t> order(E);
  for (int64_t e = 0; e < E; ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return off[a + 1] - off[a] > off[b + 1] - off[b]; });
  std::vector<std::vector<int64_t>> dealt(bins);
  std::vector<int64_t> load(bins, 0);
  for (int64_t e : order) {
    const int64_t t = std::min_element(load.begin(), load.end()) - load.begin();
    dealt[t].push_back(e);
    load[t] += off[e + 1] - off[e];
  }
  return dealt;
}

// fn(expert) for every expert, the experts dealt over the threads as above, each thread in the
// caller's grad/inference mode (worker threads do not inherit them) and below autograd.
template <typename Fn>
void for_each_expert(const int32_t* off, int64_t E, const Fn& fn) {
  const int64_t bins = std::max<int64_t>(1, std::min<int64_t>(E, at::get_num_threads()));
  const auto dealt = deal_experts(off, E, bins);
  const at::ThreadLocalState caller;
  at::parallel_for(0, bins, 1, [&](int64_t b, int64_t e) {
    at::ThreadLocalStateGuard same_modes(caller);
    at::AutoDispatchBelowAutograd below_autograd;
    for (int64_t t = b; t < e; ++t)
      for (int64_t ex : dealt[t]) fn(ex);
  });
}

// Rows up to which an expert's product takes the small-GEMM kernel rather than BLAS: measured per
// expert (128 -> 512, 4 layers' weights cycling, 1 thread) it was 25% faster at 16 rows and level
// with MKL from 40 to 64.
constexpr int64_t kSmallGemmRows = 48;

at::Tensor grouped_mm_cpu(const at::Tensor& x_PI, const at::Tensor& w_EIO, const at::Tensor& offsets_E1) {
  TORCH_CHECK(w_EIO.dim() == 3 && w_EIO.size(1) == x_PI.size(-1), "grouped_mm: w must be (E, I, O) with I = ",
              x_PI.size(-1), ", got ", w_EIO.sizes());
  TORCH_CHECK(x_PI.scalar_type() == w_EIO.scalar_type(), "grouped_mm: x is ", x_PI.scalar_type(), ", w is ",
              w_EIO.scalar_type());
  const int64_t E = w_EIO.size(0), P = x_PI.size(0), O = w_EIO.size(2);
  at::Tensor offsets = offsets_E1.contiguous();
  check_grouped(x_PI, w_EIO, offsets, E, "grouped_mm");
  const int32_t* off = offsets.data_ptr<int32_t>();
  auto out_PO = at::empty({P, O}, x_PI.options());
  at::AutoDispatchBelowAutograd below_autograd;  // this is the kernel, not a graph node
  if (off[E] < P) out_PO.narrow(0, off[E], P - off[E]).zero_();  // rows of no expert (block padding)
#ifdef HINTRL_SMALL_GEMM
  // Experts with few rows (decoding) take small_gemm_cpu.h when the weight is a transposed view of
  // (E, O, I) rows, as transformers stores experts: no packing, each weight row read once.
  const bool small = x_PI.scalar_type() == at::kFloat && x_PI.stride(1) == 1 && w_EIO.stride(1) == 1 &&
                     small_gemm_fits(w_EIO.size(1), O) && small_gemm_cpu_ok();
#else
  [[maybe_unused]] const bool small = false;
#endif
  for_each_expert(off, E, [&](int64_t ex) {
    const int64_t r0 = off[ex], n = off[ex + 1] - off[ex];
    if (n == 0) return;
#ifdef HINTRL_SMALL_GEMM
    if (small && n <= kSmallGemmRows) {
      small_gemm_nt(x_PI.data_ptr<float>() + r0 * x_PI.stride(0), x_PI.stride(0),
                    w_EIO.data_ptr<float>() + ex * w_EIO.stride(0), w_EIO.stride(2),
                    out_PO.data_ptr<float>() + r0 * O, O, n, O, w_EIO.size(1));
      return;
    }
#endif
    auto out = out_PO.narrow(0, r0, n);
    at::mm_out(out, x_PI.narrow(0, r0, n), w_EIO.select(0, ex));
  });
  return out_PO;
}

// grad_w[e] = x_e^T grad_out_e, laid out like w (a transposed weight view gets a transposed
// gradient, so the parameter's .grad needs no copy); an expert with no rows gets zeros.
at::Tensor grouped_mm_weight_grad_cpu(const at::Tensor& x_PI, const at::Tensor& grad_PO, const at::Tensor& w_EIO,
                                      const at::Tensor& offsets_E1) {
  const int64_t E = w_EIO.size(0), I = x_PI.size(1), O = grad_PO.size(1);
  TORCH_CHECK(grad_PO.dim() == 2 && grad_PO.size(0) == x_PI.size(0) && w_EIO.size(1) == I && w_EIO.size(2) == O,
              "grouped_mm_weight_grad: x ", x_PI.sizes(), ", grad ", grad_PO.sizes(), " and w ", w_EIO.sizes(),
              " do not fit");
  at::Tensor offsets = offsets_E1.contiguous();
  check_grouped(x_PI, w_EIO, offsets, E, "grouped_mm_weight_grad");
  const int32_t* off = offsets.data_ptr<int32_t>();
  auto grad_w = at::empty_like(w_EIO);
  at::AutoDispatchBelowAutograd below_autograd;
  for_each_expert(off, E, [&](int64_t ex) {
    auto out = grad_w.select(0, ex);
    const int64_t r0 = off[ex], n = off[ex + 1] - off[ex];
    if (n == 0) { out.zero_(); return; }
    at::mm_out(out, x_PI.narrow(0, r0, n).t(), grad_PO.narrow(0, r0, n));
  });
  return grad_w;
}

}  // namespace

TORCH_LIBRARY_IMPL(hintrl, CPU, m) {
  m.impl("topk_gating", &topk_gating_cpu);
  m.impl("topk_gating_backward", &topk_gating_backward_cpu);
  m.impl("expert_counts", &expert_counts_cpu);
  m.impl("permute", &permute_cpu);
  m.impl("permute_backward", &permute_backward_cpu);
  m.impl("unpermute_combine", &unpermute_combine_cpu);
  m.impl("unpermute_combine_backward", &unpermute_combine_backward_cpu);
  m.impl("grouped_mm", &grouped_mm_cpu);
  m.impl("grouped_mm_weight_grad", &grouped_mm_weight_grad_cpu);
}

}  // namespace hintrl
