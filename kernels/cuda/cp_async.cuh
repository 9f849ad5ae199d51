// cp_async.cuh -- cp.async (sm_80 and later) for the kernels that stage operands in shared memory
// (matmul_tiled.cu, flat_sum.cu): a 16- or 4-byte copy that zero-fills what it does not read,
// commit groups and the wait for all but the newest N groups. With RPC_EMULATE (the host
// emulation, tests/cuda_emulate.cpp) the copies go through the emulator's rpc_emu_* hooks.
#pragma once

namespace rpc {
// cp.async with zero fill: copies src_bytes (<= BYTES) from global memory and writes zeros up to
// BYTES in shared memory. src must be a valid address even when src_bytes is 0 (callers pass the
// operand's base then).
template <int BYTES>
__device__ __forceinline__ void cp_async(float* dst, const float* src, int src_bytes) {
#if defined(RPC_EMULATE)  // host threads: tests/cuda_emulate.cpp queues or makes the copy
  rpc_emu_cp_async(dst, src, BYTES, src_bytes);
#else
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if (BYTES == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes));
#endif
}
#if defined(RPC_EMULATE)
inline void cp_async_commit() { rpc_emu_commit(); }
template <int N>
inline void cp_async_wait() { rpc_emu_wait(N); }
#else
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
#endif

}  // namespace rpc
