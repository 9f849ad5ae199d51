// kernels_cuda.h -- the CUDA kernels' entry points: the same operators as kernels/cpu/kernels.h
// (same arguments, same layouts: raw device pointers, contiguous row-major float32 unless a
// stride is passed), plus the CUDA stream to launch on. No torch types: binding_cuda.cpp
// registers them with torch for the CUDA dispatch key and passes PyTorch's current stream.
// Every launcher returns cudaGetLastError() after its launches (a launch error, if any).
// Each kernel follows kernels/README.md (the contract) through canonical.cuh.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "ids.h"

// matmul.cu (§4.1, §8 matmul). C [batch, M, N] contiguous; A, B any strides.
cudaError_t rpc_matmul(const float* A, int64_t sab, int64_t sam, int64_t sak,
                       const float* B, int64_t sbb, int64_t sbk, int64_t sbn,
                       float* C, int64_t batch, int64_t M, int64_t N, int64_t K, cudaStream_t st);
// The same product by kernel version 1 (rpc_matmul), or 2-6 (matmul_tiled.cu; 5 and 6 only with
// RPC_DEV_VERSIONS; docs/cuda-speed.md); every version gives the same bits. cudaErrorInvalidValue
// for a version not built.
cudaError_t rpc_matmul_v(int version, const float* A, int64_t sab, int64_t sam, int64_t sak, const float* B,
                         int64_t sbb, int64_t sbk, int64_t sbn, float* C, int64_t batch, int64_t M, int64_t N,
                         int64_t K, cudaStream_t st);

// norm.cu (§8 rmsnorm). x, y [R, D]; w [D]; rstd [R]; inv_d = f32(1/D) from the host.
cudaError_t rpc_rmsnorm(const float* x, const float* w, float eps, float inv_d, float* y, float* rstd,
                        int64_t R, int64_t D, cudaStream_t st);
cudaError_t rpc_rmsnorm_backward(const float* gy, const float* x, const float* w, const float* rstd,
                                 float inv_d, float* gx, float* gw, int64_t R, int64_t D, cudaStream_t st);

// rope.cu (§8 rope). cos, sin [T, Dh/2]; x, y [B, T, H, Dh], their rows where xs, ys say
// (ids.h); inv_dh = f32(1/Dh).
cudaError_t rpc_rope_tables(int64_t T, int64_t Dh, float theta, float inv_dh, float* cos_t, float* sin_t,
                            cudaStream_t st);
cudaError_t rpc_rope(const float* x, RpRows xs, const float* cos_t, const float* sin_t, float* y, RpRows ys,
                     int64_t B, int64_t T, int64_t H, int64_t Dh, bool backward, cudaStream_t st);

// attention.cu (§8 causal_softmax). s, p, gp, gs [BH, T, T].
cudaError_t rpc_causal_softmax(const float* s, float scale, float* p, int64_t BH, int64_t T, cudaStream_t st);
cudaError_t rpc_causal_softmax_backward(const float* gp, const float* p, float scale, float* gs, int64_t BH,
                                        int64_t T, cudaStream_t st);

// window.cu (§8 window attention); layouts as kernels/cpu/kernels.h's window.cpp entries.
cudaError_t rpc_band_scores(const float* a, const float* b, float* s, int64_t batch, int64_t M, int64_t T, int64_t D,
                            int64_t W, cudaStream_t st);
cudaError_t rpc_band_mix(const float* p, const float* b, float* o, int64_t batch, int64_t M, int64_t T, int64_t D,
                         int64_t W, cudaStream_t st);
cudaError_t rpc_band_mix_t(const float* p, const float* a, float* o, int64_t batch, int64_t M, int64_t T, int64_t D,
                           int64_t W, cudaStream_t st);
cudaError_t rpc_window_softmax(const float* s, float scale, float* p, int64_t rows, int64_t T, int64_t W,
                               cudaStream_t st);
cudaError_t rpc_window_softmax_backward(const float* gp, const float* p, float scale, float* gs, int64_t rows,
                                        int64_t T, int64_t W, cudaStream_t st);

// mlp.cu (§8 swiglu). u [R, 2H] = [gate | up]; out [R, H].
cudaError_t rpc_swiglu(const float* u, float* out, int64_t R, int64_t H, cudaStream_t st);
cudaError_t rpc_swiglu_backward(const float* g, const float* u, float* gu, int64_t R, int64_t H, cudaStream_t st);

// loss.cu (§8 cross_entropy). z [R, V]; targets [R] (already range-checked); loss scalar; lse [R];
// row_loss [R] scratch; g: the incoming gradient, a device scalar; inv_r = f32(1/R) and
// two_z = f32(2 * zloss) from the host.
cudaError_t rpc_cross_entropy(const float* z, const int64_t* targets, float zloss, float inv_r, float* loss,
                              float* lse, float* row_loss, int64_t R, int64_t V, cudaStream_t st);
cudaError_t rpc_cross_entropy_backward(const float* g, const float* z, const int64_t* targets, const float* lse,
                                       float inv_r, float two_z, float* gz, int64_t R, int64_t V, cudaStream_t st);

// embedding.cu (§8 embedding). w [V, D]; idx [N]; out [N, D]; gw [V, D].
// rpc_check_index: *host_bad = 1 if any idx is outside [0, hi), else 0; bad is one device int of
// scratch. It waits for the stream (the answer decides whether the op may run at all).
cudaError_t rpc_check_index(const int64_t* idx, int64_t n, int64_t hi, int* bad, int* host_bad, cudaStream_t st);
cudaError_t rpc_embedding(const float* w, const int64_t* idx, float* out, int64_t N, int64_t D, cudaStream_t st);
cudaError_t rpc_embedding_backward(const float* g, const int64_t* idx, float* gw, int64_t N, int64_t V, int64_t D,
                                   cudaStream_t st);

// elementwise.cu (§5, §8 add/mul/scale/dropout/csum, §2 canary).
cudaError_t rpc_unary(RpFn fn, const float* x, float* y, int64_t n, cudaStream_t st);
cudaError_t rpc_add(const float* a, const float* b, float* y, int64_t n, cudaStream_t st);
cudaError_t rpc_mul(const float* a, const float* b, float* y, int64_t n, cudaStream_t st);
cudaError_t rpc_scale(const float* a, float s, float* y, int64_t n, cudaStream_t st);
cudaError_t rpc_csum_rows(const float* x, float* y, int64_t rows, int64_t n, cudaStream_t st);
cudaError_t rpc_dropout(const float* x, float* y, int64_t n, uint32_t threshold, float scale, uint64_t seed,
                        uint32_t c1, uint32_t c2, cudaStream_t st);
// out[0] = a*b + c written with plain operators (0 unless --fmad contracted it), out[1] = 1 if a
// subnormal product survived (-ftz missing), as in rp_canary.
cudaError_t rpc_canary(float* out, cudaStream_t st);

// optim.cu (§8 adamw, clip_grad; the norm by §4.5). coef: one float of device scratch; sums:
// ceil(n / kFlatChunk) floats of device scratch (the chunk sums).
cudaError_t rpc_adamw(float* p, const float* g, float* m, float* v, int64_t n, float lr, float b1, float b2,
                      float omb1, float omb2, float eps, float decay, float bc1, float bc2, cudaStream_t st);
cudaError_t rpc_clip_grad(const float* g, float max_norm, float* out, float* norm, float* coef, float* sums,
                          int64_t n, cudaStream_t st);
// out = g * coef[0]: clip_grad's second kernel on its own.
cudaError_t rpc_clip_apply(const float* g, const float* coef, float* out, int64_t n, cudaStream_t st);
// clip_grad by version 1 (rpc_clip_grad) or 2 (dev/cuda/flat_sum.cu: the norm streamed through one
// block, built only with RPC_DEV_VERSIONS); both give the same bits. cudaErrorInvalidValue for a
// version not built.
cudaError_t rpc_clip_grad_v(int version, const float* g, float max_norm, float* out, float* norm, float* coef,
                            float* sums, int64_t n, cudaStream_t st);

// random.cu (§6). words: n uint32 values stored as int64 (as the CPU op returns them).
cudaError_t rpc_philox(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, uint32_t block_offset,
                       int64_t* words, int64_t n, cudaStream_t st);
cudaError_t rpc_uniform(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, float* out, int64_t n,
                        cudaStream_t st);
cudaError_t rpc_normal(uint64_t seed, uint32_t c1, uint32_t c2, uint32_t purpose, float* out, int64_t n,
                       cudaStream_t st);

// int8.cu (§10). q [R, C] int8; s [R] (or [1] with R = 1); A [M, K], B [N, K] int8 on the grid
// [-127, 127] with K * 127^2 < 2^31 (the binding checks both). rpc_int8_gemm writes C32 [M, N]
// (sx == nullptr) or Y [M, N] = float(C32) * (sx[0] * sw[j]) (sx [1], sw [N] device floats).
// rpc_int8_find_offgrid: *host_bad = 1 if p holds -128; like rpc_check_index, it waits.
cudaError_t rpc_int8_quantize(const float* x, const float* s, int8_t* q, int64_t R, int64_t C, cudaStream_t st);
cudaError_t rpc_int8_dequantize(const int8_t* q, const float* s, float* y, int64_t R, int64_t C, cudaStream_t st);
cudaError_t rpc_int8_find_offgrid(const int8_t* p, int64_t n, int* bad, int* host_bad, cudaStream_t st);
cudaError_t rpc_int8_gemm(const int8_t* A, const int8_t* B, int64_t M, int64_t N, int64_t K, const float* sx,
                          const float* sw, int32_t* C32, float* Y, cudaStream_t st);
// The int8 linear's epilogue on its own, for an int32 product made elsewhere (cuBLASLt):
// Y [M, N] = float(C32) * (sx[0] * sw[j]), the same operations as rpc_int8_gemm's epilogue.
cudaError_t rpc_int8_dequantize_cols(const int32_t* C32, const float* sx, const float* sw, float* Y, int64_t M,
                                     int64_t N, cudaStream_t st);
// int8_pv.cu (§10 int8 P·V): the block step rule over the rows of x [R, C] -> s [R]; the int8
// band mix qp [batch, M, W] x qv [batch, T, D] -> o [batch, M, D], sp [batch * M], sv [batch].
cudaError_t rpc_int8_absmax_step(const float* x, float* s, int64_t R, int64_t C, cudaStream_t st);
cudaError_t rpc_int8_band_mix(const int8_t* qp, const int8_t* qv, const float* sp, const float* sv, float* o,
                              int64_t batch, int64_t M, int64_t T, int64_t D, int64_t W, cudaStream_t st);
cudaError_t rpc_lsq_init(const float* x, float* s, int64_t R, int64_t C, float inv_c, cudaStream_t st);
cudaError_t rpc_lsq_backward(const float* x, const float* s, const float* gxh, float g, float* gx, float* gs,
                             int64_t R, int64_t C, cudaStream_t st);

// exact.cu (§11). A [M, K], Bt [N, K] float32 (K-contiguous rows, K < 2^31), C [M, N]; work:
// rpc_exact_workspace_bytes(M, N, K) bytes of device memory (planes, residue sums, exponents).
// gemm: the residue GEMM, C32 [M, N] = A [M, K] . B [N, K]^T in int32 on int8 planes (|sum| < 2^31,
// so any exact GEMM gives the same bits); nullptr is rpc_int8_gemm (int8.cu's mma.sync), the
// binding can pass cuBLASLt's (binding_cuda.cpp, REPOPS_CUDA_EXACT_GEMM). ctx is passed through.
using RpcInt8Gemm = cudaError_t (*)(const int8_t* A, const int8_t* B, int32_t* C32, int64_t M, int64_t N, int64_t K,
                                    void* ctx, cudaStream_t st);
int64_t rpc_exact_workspace_bytes(int64_t M, int64_t N, int64_t K);
cudaError_t rpc_exact_matmul(const float* A, const float* Bt, float* C, int64_t M, int64_t N, int64_t K, void* work,
                             RpcInt8Gemm gemm, void* ctx, cudaStream_t st);
