// cuda_exact_emulate.cpp -- kernels/cuda/exact.cu (the exact matmul, contract §11) run on the
// host, for tests/test_cuda_exact.py: exact.cu compiled as C++ with RPC_EMULATE, so its launches
// are host loops over the same __host__ __device__ element functions (exponents lane by lane then
// the warp's max / or, split, combine, reconstruct) and the same orchestration (workspace layout,
// panels, k chunks); the residue GEMM is a plain int32 loop here (int8.cu's GEMM is checked
// against the CPU on a GPU by tests/test_cuda_int8.py). Every case runs twice: with the default
// GEMM (gemm = nullptr: rpc_int8_gemm) and with a caller's GEMM (the path cuBLASLt takes on a GPU),
// here the same sums in decreasing k; the two must agree bit for bit and the caller's must be called. No float operation is emulated: the only
// one, the int64 -> float32 conversion, is the host's (round to nearest even).
//
//   cuda_exact_emulate IN OUT   IN: records of 5 int64 (M, N, K, chunk, res_bytes: the
//                               k chunk and the panel size, kernel constants on the device) then A [M, K] and
//                               Bt [N, K] float32; OUT: each C [M, N] float32
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "exact.cu"

// C32 [M, N] = A [M, K] . B [N, K]^T in int32 (exact: the binding's bound, |sum| < 2^31).
cudaError_t rpc_int8_gemm(const int8_t* A, const int8_t* B, int64_t M, int64_t N, int64_t K, const float*,
                          const float*, int32_t* C32, float*, cudaStream_t) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      int32_t acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += (int32_t)A[i * K + k] * (int32_t)B[j * K + k];
      C32[i * N + j] = acc;
    }
  return cudaSuccess;
}

// The caller's residue GEMM (RpcInt8Gemm): decreasing k, and it counts its calls through ctx.
cudaError_t reversed_gemm(const int8_t* A, const int8_t* B, int32_t* C32, int64_t M, int64_t N, int64_t K, void* ctx,
                          cudaStream_t) {
  ++*static_cast<int64_t*>(ctx);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      int32_t acc = 0;
      for (int64_t k = K - 1; k >= 0; --k) acc += (int32_t)A[i * K + k] * (int32_t)B[j * K + k];
      C32[i * N + j] = acc;
    }
  return cudaSuccess;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: cuda_exact_emulate IN OUT\n");
    return 2;
  }
  FILE *in = std::fopen(argv[1], "rb"), *out = std::fopen(argv[2], "wb");
  if (!in || !out) return 2;
  int64_t head[5];
  while (std::fread(head, sizeof(head), 1, in) == 1) {
    const int64_t M = head[0], N = head[1], K = head[2], chunk = head[3], res_bytes = head[4];
    std::vector<float> A(M * K), Bt(N * K), C(M * N);
    if (std::fread(A.data(), 4, A.size(), in) != A.size() || std::fread(Bt.data(), 4, Bt.size(), in) != Bt.size())
      return 3;
    std::vector<char> work(rpc_emu_exact_workspace_bytes(M, N, K, chunk, res_bytes));
    if (rpc_emu_exact_matmul(A.data(), Bt.data(), C.data(), M, N, K, work.data(), chunk, res_bytes, nullptr,
                             nullptr) != cudaSuccess)
      return 4;
    std::vector<float> C2(M * N);
    int64_t calls = 0;
    if (rpc_emu_exact_matmul(A.data(), Bt.data(), C2.data(), M, N, K, work.data(), chunk, res_bytes, reversed_gemm,
                             &calls) != cudaSuccess)
      return 4;
    if (std::memcmp(C.data(), C2.data(), 4 * C.size()) != 0) return 5;   // the caller's GEMM changed a bit
    const int64_t mp = rpc::plan_of(M, N, K, chunk, res_bytes).mp;   // rows per panel
    if (M > 0 && N > 0 && K > 0 && calls != 8 * ((K + chunk - 1) / chunk) * ((M + mp - 1) / mp))
      return 6;                                                          // not every residue GEMM went to it
    std::fwrite(C.data(), 4, C.size(), out);
  }
  std::fclose(out);
  return 0;
}
