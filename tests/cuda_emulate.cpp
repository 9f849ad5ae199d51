// cuda_emulate.cpp -- kernels/cuda/matmul_tiled.cu (matmul versions 2 and 3) and dev/cuda/flat_sum.cu
// (clip_grad version 2's norm) run on the host, for tests/test_cuda_emulate.py: the kernel
// sources compiled as C++ with RPC_EMULATE, each CUDA
// thread of a block a host thread (x86 FTZ|DAZ set, as -ftz=true on the device), __syncthreads a
// std::barrier, __shared__ arrays static (one block runs at a time), cp.async a copy with the
// zero fill, made when issued or only at the wait that covers it. Same index arithmetic, staging
// layouts, double buffering, edge handling and k order as on the GPU; the float operations are
// the host's (fadd = a + b, -ffp-contract=off).
//
//   cuda_emulate matmul IN OUT   IN: records of 16 int64 (version, batch, M, N, K, sab, sam, sak,
//                                sbb, sbk, sbn, a_offset, b_offset, a_len, b_len, deferred) then
//                                a_len and b_len float32 (the storages); OUT: each C [batch, M, N]
//   cuda_emulate clip IN OUT     IN: records of 4 int64 (n, offset, len, deferred), one float32
//                                max_norm, then len float32; OUT: each (norm, coef) of version 2
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include <xmmintrin.h>

#include <cuda_runtime.h>  // dim3, float4, cudaError_t; then the CUDA keywords as host C++:

#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)

struct EmuIdx { unsigned x, y, z; };
thread_local EmuIdx emu_thread, emu_block;
thread_local std::barrier<>* emu_bar;
#define threadIdx emu_thread
#define blockIdx emu_block
#define __syncthreads() emu_bar->arrive_and_wait()

// cp.async: each thread's copies in commit groups. g_deferred = 0: every copy is made when it is
// issued (a stage refilled while another thread still reads it shows); 1: only when a wait
// covers its group (a stage read before its wait shows).
int g_deferred = 0;
struct Copy { float* dst; const float* src; int bytes, src_bytes; };
thread_local std::deque<std::vector<Copy>> emu_groups;  // committed groups, oldest first
thread_local std::vector<Copy> emu_open;                // issued since the last commit

void emu_copy(const Copy& c) {
  std::memcpy(c.dst, c.src, c.src_bytes);
  std::memset(reinterpret_cast<char*>(c.dst) + c.src_bytes, 0, c.bytes - c.src_bytes);
}
void rpc_emu_cp_async(float* dst, const float* src, int bytes, int src_bytes) {
  if (g_deferred) emu_open.push_back({dst, src, bytes, src_bytes});
  else emu_copy({dst, src, bytes, src_bytes});
}
void rpc_emu_commit() {
  emu_groups.push_back(std::move(emu_open));
  emu_open.clear();
}
void rpc_emu_wait(int newest_pending) {  // cp.async.wait_group N: all but the newest N groups are done
  while ((int)emu_groups.size() > newest_pending) {
    for (const Copy& c : emu_groups.front()) emu_copy(c);
    emu_groups.pop_front();
  }
}

// One launch: the blocks one after another, each as `threads` host threads.
template <class F>
void rpc_emulate(dim3 grid, int threads, F body) {
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        std::barrier<> bar(threads);
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t)
          pool.emplace_back([&, t] {
            _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ | DAZ
            emu_thread = {(unsigned)t, 0, 0};
            emu_block = {x, y, z};
            emu_bar = &bar;
            body();
          });
        for (auto& th : pool) th.join();
      }
}

cudaError_t cudaGetLastError() { return cudaSuccess; }  // declared by cuda_runtime_api.h
// Version 4 asks for the GPU's SM count, then runs 2 or 3; it is not emulated itself.
cudaError_t cudaGetDevice(int*) { return cudaErrorNotSupported; }
cudaError_t cudaDeviceGetAttribute(int*, cudaDeviceAttr, int) { return cudaErrorNotSupported; }
// Version 1 (matmul.cu) is not part of the emulation.
cudaError_t rpc_matmul(const float*, int64_t, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, float*,
                       int64_t, int64_t, int64_t, int64_t, cudaStream_t) {
  return cudaErrorNotSupported;
}
// Nor are optim.cu's kernels: version 1 of the norm, and applying the coefficient (only the norm
// and the coefficient are compared).
cudaError_t rpc_clip_grad(const float*, float, float*, float*, float*, float*, int64_t, cudaStream_t) {
  return cudaErrorNotSupported;
}
cudaError_t rpc_clip_apply(const float*, const float*, float*, int64_t, cudaStream_t) { return cudaSuccess; }

#include "matmul_tiled.cu"
#include "flat_sum.cu"

int clip_main(FILE* in, FILE* out) {
  int64_t h[4];
  float max_norm;
  while (std::fread(h, sizeof(int64_t), 4, in) == 4 && std::fread(&max_norm, 4, 1, in) == 1) {
    std::vector<float> g(h[2] + 4);
    if (std::fread(g.data(), 4, h[2], in) != (size_t)h[2]) return 2;
    g_deferred = (int)h[3];
    float res[2] = {std::nanf(""), std::nanf("")};
    const cudaError_t err = rpc_clip_grad_v(2, g.data() + h[1], max_norm, nullptr, &res[0], &res[1], nullptr, h[0],
                                            nullptr);
    if (err != cudaSuccess) return 1;
    std::fwrite(res, 4, 2, out);
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  FILE* in = std::fopen(argv[2], "rb");
  FILE* out = std::fopen(argv[3], "wb");
  if (!in || !out) return 2;
  if (std::strcmp(argv[1], "clip") == 0) {
    const int rc = clip_main(in, out);
    std::fclose(out);
    return rc;
  }
  int64_t h[16];
  while (std::fread(h, sizeof(int64_t), 16, in) == 16) {
    const int64_t version = h[0], batch = h[1], M = h[2], N = h[3], K = h[4];
    g_deferred = (int)h[15];
    std::vector<float> a(h[13] + 1), b(h[14] + 1), c(batch * M * N, std::nanf(""));
    if (std::fread(a.data(), 4, h[13], in) != (size_t)h[13] || std::fread(b.data(), 4, h[14], in) != (size_t)h[14])
      return 2;
    const cudaError_t err = rpc_matmul_v((int)version, a.data() + h[11], h[5], h[6], h[7], b.data() + h[12], h[8],
                                         h[9], h[10], c.data(), batch, M, N, K, nullptr);
    if (err != cudaSuccess) {
      std::fprintf(stderr, "rpc_matmul_v: error %d\n", (int)err);
      return 1;
    }
    std::fwrite(c.data(), 4, c.size(), out);
  }
  std::fclose(out);
  return 0;
}
