// cuda_exact_emulate.cpp -- kernels/cuda/exact.cu (the exact matmul, contract §11) run on the
// host, for tests/test_cuda_exact.py: exact.cu compiled as C++ with RPC_EMULATE, so its launches
// are host loops over the same __host__ __device__ element functions (exponents lane by lane then
// the warp's max / or, split, combine, reconstruct) and the same orchestration (workspace layout,
// panels, k chunks); the residue GEMM is a plain int32 loop here (int8.cu's GEMM is checked
// against the CPU on a GPU by tests/test_cuda_int8.py). No float operation is emulated: the only
// one, the int64 -> float32 conversion, is the host's (round to nearest even).
//
//   cuda_exact_emulate IN OUT   IN: records of 5 int64 (M, N, K, chunk, res_bytes: the
//                               k chunk and the panel size, kernel constants on the device) then A [M, K] and
//                               Bt [N, K] float32; OUT: each C [M, N] float32
#include <cstdint>
#include <cstdio>
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
    if (rpc_emu_exact_matmul(A.data(), Bt.data(), C.data(), M, N, K, work.data(), chunk, res_bytes) != cudaSuccess) return 4;
    std::fwrite(C.data(), 4, C.size(), out);
  }
  std::fclose(out);
  return 0;
}
