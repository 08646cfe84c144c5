// CUDA implementations of the hintrl routing ops: device/shape/dtype checks, output allocation,
// then the raw-pointer launchers of moe_cuda.cu on the current stream. Module stub: kernels._cuda.
// Shape legend: see moe_core.h.
#include <Python.h>
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "moe_core.h"
#include "moe_cuda_launch.h"

namespace hintrl {
namespace {

void check_cuda(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.is_cuda(), "hintrl::", op, ": `", name, "` is on ", t.device(),
              " but the CUDA kernel needs CUDA tensors; move every input to the same GPU");
}

void check_ids(const at::Tensor& ids, const char* op) {
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong, "hintrl::", op,
              ": ids must be int64 of shape (T, K), got ", ids.scalar_type(), " ", ids.sizes());
}

Dtype dtype_code(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return Dtype::F32;
    case at::kDouble: return Dtype::F64;
    case at::kHalf: return Dtype::F16;
    case at::kBFloat16: return Dtype::BF16;
    default: TORCH_CHECK(false, "hintrl::", op, ": unsupported dtype ", t.scalar_type());
  }
}

at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }
cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

std::tuple<at::Tensor, at::Tensor> topk_gating_cuda(const at::Tensor& logits_TE, int64_t k, bool renorm,
                                                   const std::optional<at::Tensor>& forced_TK) {
  check_cuda(logits_TE, "topk_gating", "logits");
  TORCH_CHECK(logits_TE.dim() == 2, "hintrl::topk_gating: logits must be (T, E), got ", logits_TE.sizes());
  const c10::cuda::CUDAGuard guard(logits_TE.device());
  const int64_t T = logits_TE.size(0), E = logits_TE.size(1);
  TORCH_CHECK(k >= 1 && k <= E, "hintrl::topk_gating: need 1 <= k <= E, got k=", k, " E=", E);
  TORCH_CHECK(k <= kMaxTopK, "hintrl::topk_gating: k=", k, " is above the ", kMaxTopK, " slots per row the kernels hold");
  at::Tensor logits = logits_TE.contiguous(), forced;
  if (forced_TK.has_value()) {
    forced = forced_TK->contiguous();
    check_cuda(forced, "topk_gating", "forced_ids");
    check_ids(forced, "topk_gating");
    TORCH_CHECK(forced.size(0) == T && forced.size(1) == k, "hintrl::topk_gating: forced_ids must be (T, k)");
  }
  auto w_TK = at::empty({T, k}, logits.options().dtype(acc_type(logits.scalar_type())));
  auto ids_TK = at::empty({T, k}, logits.options().dtype(at::kLong));
  launch_topk_gating(dtype_code(logits, "topk_gating"), logits.data_ptr(), T, E, k, renorm,
                     forced.defined() ? forced.data_ptr<int64_t>() : nullptr, w_TK.data_ptr(),
                     ids_TK.data_ptr<int64_t>(), stream());
  return {w_TK, ids_TK};
}

at::Tensor topk_gating_backward_cuda(const at::Tensor& grad_w_TK, const at::Tensor& logits_TE, const at::Tensor& ids_TK,
                                     bool renorm) {
  check_cuda(logits_TE, "topk_gating_backward", "logits");
  check_cuda(ids_TK, "topk_gating_backward", "ids");
  check_ids(ids_TK, "topk_gating_backward");
  TORCH_CHECK(ids_TK.size(1) <= kMaxTopK, "hintrl::topk_gating_backward: k=", ids_TK.size(1), " is above the ",
              kMaxTopK, " slots per row the kernels hold");
  const c10::cuda::CUDAGuard guard(logits_TE.device());
  at::Tensor logits = logits_TE.contiguous(), ids = ids_TK.contiguous();
  at::Tensor gw = grad_w_TK.to(acc_type(logits.scalar_type())).contiguous();
  auto glogits = at::empty_like(logits);
  launch_topk_gating_backward(dtype_code(logits, "topk_gating_backward"), gw.data_ptr(), logits.data_ptr(),
                              ids.data_ptr<int64_t>(), logits.size(0), logits.size(1), ids.size(1), renorm,
                              glogits.data_ptr(), stream());
  return glogits;
}

at::Tensor chunk_hist(const at::Tensor& ids, int64_t E) {
  const int64_t C = (ids.numel() + kCudaChunk - 1) / kCudaChunk;
  return at::empty({C * E}, ids.options().dtype(at::kInt));
}

std::tuple<at::Tensor, at::Tensor> expert_counts_cuda(const at::Tensor& ids_TK, int64_t E, int64_t block) {
  check_cuda(ids_TK, "expert_counts", "ids");
  check_ids(ids_TK, "expert_counts");
  TORCH_CHECK(E >= 1 && block >= 1, "hintrl::expert_counts: need num_experts >= 1 and block >= 1");
  const c10::cuda::CUDAGuard guard(ids_TK.device());
  at::Tensor ids = ids_TK.contiguous();
  auto counts = at::empty({E}, ids.options().dtype(at::kInt));
  auto offsets = at::empty({E + 1}, ids.options().dtype(at::kInt));
  at::Tensor hist = chunk_hist(ids, E);
  launch_expert_counts(ids.data_ptr<int64_t>(), ids.numel(), E, block, hist.data_ptr<int32_t>(),
                       counts.data_ptr<int32_t>(), offsets.data_ptr<int32_t>(), stream());
  return {counts, offsets};
}

std::tuple<at::Tensor, at::Tensor> permute_cuda(const at::Tensor& x_TD, const at::Tensor& ids_TK,
                                                const at::Tensor& offsets_E1, int64_t block) {
  check_cuda(x_TD, "permute", "x");
  check_cuda(ids_TK, "permute", "ids");
  check_cuda(offsets_E1, "permute", "offsets");
  check_ids(ids_TK, "permute");
  TORCH_CHECK(x_TD.dim() == 2 && x_TD.size(0) == ids_TK.size(0), "hintrl::permute: x must be (T, D), T = ids.size(0)");
  TORCH_CHECK(offsets_E1.dim() == 1 && offsets_E1.scalar_type() == at::kInt && offsets_E1.size(0) >= 2,
              "hintrl::permute: offsets must be int32 of shape (E+1,)");
  const c10::cuda::CUDAGuard guard(x_TD.device());
  at::Tensor x = x_TD.contiguous(), ids = ids_TK.contiguous(), offsets = offsets_E1.contiguous();
  const int64_t T = x.size(0), D = x.size(1), K = ids.size(1), E = offsets.size(0) - 1;
  const int64_t P = permuted_rows(T * K, E, block);
  // The per-chunk histogram is recomputed rather than passed in from expert_counts: it is O(S)
  // integer work and keeps the op signature free of scratch tensors.
  at::Tensor hist = chunk_hist(ids, E);
  auto counts = at::empty({E}, ids.options().dtype(at::kInt));
  auto scratch_offsets = at::empty({E + 1}, ids.options().dtype(at::kInt));
  launch_expert_counts(ids.data_ptr<int64_t>(), ids.numel(), E, block, hist.data_ptr<int32_t>(),
                       counts.data_ptr<int32_t>(), scratch_offsets.data_ptr<int32_t>(), stream());
  auto src = at::empty({P}, ids.options());
  auto xs = at::empty({P, D}, x.options());
  auto pos = at::empty({T, K}, ids.options());
  launch_permute(dtype_code(x, "permute"), x.data_ptr(), ids.data_ptr<int64_t>(), T, K, D, E,
                 offsets.data_ptr<int32_t>(), hist.data_ptr<int32_t>(), src.data_ptr<int64_t>(), P, xs.data_ptr(),
                 pos.data_ptr<int64_t>(), stream());
  return {xs, pos};
}

at::Tensor permute_backward_cuda(const at::Tensor& grad_xs_PD, const at::Tensor& pos_TK) {
  check_cuda(grad_xs_PD, "permute_backward", "grad");
  check_cuda(pos_TK, "permute_backward", "pos");
  check_ids(pos_TK, "permute_backward");
  const c10::cuda::CUDAGuard guard(grad_xs_PD.device());
  at::Tensor g = grad_xs_PD.contiguous(), pos = pos_TK.contiguous();
  auto gx = at::empty({pos.size(0), g.size(1)}, g.options());
  launch_permute_backward(dtype_code(g, "permute_backward"), g.data_ptr(), pos.data_ptr<int64_t>(), pos.size(0),
                          pos.size(1), g.size(1), gx.data_ptr(), stream());
  return gx;
}

at::Tensor unpermute_combine_cuda(const at::Tensor& ys_PD, const at::Tensor& pos_TK, const at::Tensor& w_TK) {
  check_cuda(ys_PD, "unpermute_combine", "y_sorted");
  check_cuda(pos_TK, "unpermute_combine", "pos");
  check_cuda(w_TK, "unpermute_combine", "weights");
  check_ids(pos_TK, "unpermute_combine");
  TORCH_CHECK(w_TK.sizes() == pos_TK.sizes(), "hintrl::unpermute_combine: weights and pos shapes differ");
  const c10::cuda::CUDAGuard guard(ys_PD.device());
  at::Tensor ys = ys_PD.contiguous(), pos = pos_TK.contiguous();
  at::Tensor w = w_TK.to(acc_type(ys.scalar_type())).contiguous();
  auto out = at::empty({pos.size(0), ys.size(1)}, ys.options());
  launch_unpermute_combine(dtype_code(ys, "unpermute_combine"), ys.data_ptr(), pos.data_ptr<int64_t>(), w.data_ptr(),
                           pos.size(0), pos.size(1), ys.size(1), out.data_ptr(), stream());
  return out;
}

std::tuple<at::Tensor, at::Tensor> unpermute_combine_backward_cuda(const at::Tensor& grad_out_TD, const at::Tensor& ys_PD,
                                                                   const at::Tensor& pos_TK, const at::Tensor& w_TK) {
  check_cuda(grad_out_TD, "unpermute_combine_backward", "grad");
  check_cuda(ys_PD, "unpermute_combine_backward", "y_sorted");
  check_ids(pos_TK, "unpermute_combine_backward");
  const c10::cuda::CUDAGuard guard(ys_PD.device());
  at::Tensor ys = ys_PD.contiguous(), pos = pos_TK.contiguous(), g = grad_out_TD.to(ys.scalar_type()).contiguous();
  at::Tensor w = w_TK.to(acc_type(ys.scalar_type())).contiguous();
  auto gys = at::empty_like(ys);                 // every row written by the kernels: no zero fill
  auto gw = at::empty(pos.sizes(), w.options());
  auto covered = at::empty({ys.size(0)}, ys.options().dtype(at::kByte));
  launch_unpermute_combine_backward(dtype_code(ys, "unpermute_combine_backward"), g.data_ptr(), ys.data_ptr(),
                                    pos.data_ptr<int64_t>(), w.data_ptr(), pos.size(0), pos.size(1), ys.size(1),
                                    ys.size(0), covered.data_ptr<uint8_t>(), gys.data_ptr(), gw.data_ptr(), stream());
  return {gys, gw};
}

}  // namespace

TORCH_LIBRARY_IMPL(hintrl, CUDA, m) {
  m.impl("topk_gating", &topk_gating_cuda);
  m.impl("topk_gating_backward", &topk_gating_backward_cuda);
  m.impl("expert_counts", &expert_counts_cuda);
  m.impl("permute", &permute_cuda);
  m.impl("permute_backward", &permute_backward_cuda);
  m.impl("unpermute_combine", &unpermute_combine_cuda);
  m.impl("unpermute_combine_backward", &unpermute_combine_backward_cuda);
}

}  // namespace hintrl

extern "C" PyObject* PyInit__cuda(void) {
  static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_cuda", nullptr, -1, nullptr};
  return PyModule_Create(&def);
}
