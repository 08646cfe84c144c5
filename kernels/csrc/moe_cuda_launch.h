// Host-callable launchers for the CUDA routing kernels (moe_cuda.cu). Plain pointers and a dtype
// code only: the .cu file then needs no ATen headers, which keeps its nvcc compile short.
// Shape legend: see moe_core.h.
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

namespace hintrl {

enum class Dtype : int { F32 = 0, F64 = 1, F16 = 2, BF16 = 3 };

// Slots per chunk of the counting sort on the GPU (one thread per chunk).
constexpr int64_t kCudaChunk = 64;

void launch_topk_gating(Dtype dt, const void* logits_TE, int64_t T, int E, int K, bool renorm,
                        const int64_t* forced_TK, void* w_TK, int64_t* ids_TK, cudaStream_t stream);
void launch_topk_gating_backward(Dtype dt, const void* grad_w_TK, const void* logits_TE, const int64_t* ids_TK,
                                 int64_t T, int E, int K, bool renorm, void* grad_logits_TE, cudaStream_t stream);
// hist_CE must hold C*E int32 with C = ceil(S / kCudaChunk); it is zeroed here.
void launch_expert_counts(const int64_t* ids_S, int64_t S, int E, int block, int32_t* hist_CE, int32_t* counts_E,
                          int32_t* offsets_E1, cudaStream_t stream);
// Needs hist_CE as left by launch_expert_counts with the same ids; src_P is scratch of P int64.
void launch_permute(Dtype dt, const void* x_TD, const int64_t* ids_S, int64_t T, int K, int64_t D, int E,
                    const int32_t* offsets_E1, int32_t* hist_CE, int64_t* src_P, int64_t P, void* xs_PD,
                    int64_t* pos_S, cudaStream_t stream);
void launch_permute_backward(Dtype dt, const void* grad_xs_PD, const int64_t* pos_TK, int64_t T, int K, int64_t D,
                             void* grad_x_TD, cudaStream_t stream);
void launch_unpermute_combine(Dtype dt, const void* ys_PD, const int64_t* pos_TK, const void* w_TK, int64_t T,
                              int K, int64_t D, void* out_TD, cudaStream_t stream);
// Writes every row of grad_ys_PD (P rows): one warp per slot, then zeros on the rows no slot points
// at; covered_P is scratch of P bytes.
void launch_unpermute_combine_backward(Dtype dt, const void* grad_out_TD, const void* ys_PD, const int64_t* pos_TK,
                                       const void* w_TK, int64_t T, int K, int64_t D, int64_t P, uint8_t* covered_P,
                                       void* grad_ys_PD, void* grad_w_TK, cudaStream_t stream);

}  // namespace hintrl
