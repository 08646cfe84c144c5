// Schemas of the hintrl routing ops and the Python module stub of the CPU extension (kernels._C).
// Implementations register per backend: moe_cpu.cpp and attention_cpu.cpp (CPU), moe_cuda_ops.cpp (CUDA,
// kernels._cuda).
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(hintrl, m) {
  m.def("topk_gating(Tensor logits, int k, bool renorm, Tensor? forced_ids) -> (Tensor, Tensor)");
  m.def("topk_gating_backward(Tensor grad_weights, Tensor logits, Tensor ids, bool renorm) -> Tensor");
  m.def("expert_counts(Tensor ids, int num_experts, int block) -> (Tensor, Tensor)");
  m.def("permute(Tensor x, Tensor ids, Tensor offsets, int block) -> (Tensor, Tensor)");
  m.def("permute_backward(Tensor grad_x_sorted, Tensor pos) -> Tensor");
  m.def("unpermute_combine(Tensor y_sorted, Tensor pos, Tensor weights) -> Tensor");
  m.def("unpermute_combine_backward(Tensor grad_out, Tensor y_sorted, Tensor pos, Tensor weights) -> (Tensor, Tensor)");
  m.def("grouped_mm(Tensor x, Tensor w, Tensor offsets) -> Tensor");
  m.def("grouped_mm_weight_grad(Tensor x, Tensor grad_out, Tensor w, Tensor offsets) -> Tensor");
  // Fused decode attention (attention_cpu.cpp, CPU only): writes the new key/value into the caches.
  m.def("decode_attention(Tensor qkv, Tensor? norm_weight, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, int length, Tensor bias, float scale, float eps) -> Tensor");
}

extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&def);
}
