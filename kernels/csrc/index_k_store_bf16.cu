// Fused RMSNorm + RoPE + Hadamard + bf16 store of DeepSeek-V4 DSA indexer keys.
//
// Mirrors `fused_norm_rope_indexer` in SGLang 0.5.23
// (sglang/kernels/jit/csrc/deepseek_v4/fused_norm_rope_v2.cuh): same plans, same
// position rule (plan.seq_len - compress_ratio), same math order (RMSNorm in fp32,
// interleaved complex RoPE on the last 64 dims, unnormalised Sylvester Hadamard over
// the 128 dims scaled by 1/sqrt(128)). Only the store differs: instead of
// 128 fp8 bytes + one fp32 scale per token (132 B, page = 64*128 fp8 then 64*4 scale
// bytes) it writes the 128 values as bf16 (256 B/token); a page of 64 tokens is a
// [64, 1, 128] bf16 block, so token slot `out_loc` lives at element out_loc * 128
// whatever the page size.
//
// One token per warp, 8 warps (tokens) per block; each lane owns 4 consecutive dims.
// Plain CUDA, no SGLang headers: built ahead of time by pdstack_kernels.build into a
// shared library and called through ctypes (see pdstack_kernels/store.py).

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace pdstack {

constexpr int kWarpThreads = 32;
constexpr int kBlockSize = 256;
constexpr int kNumWarps = kBlockSize / kWarpThreads;
constexpr int kHeadDim = 128;
constexpr int kRopeDim = 64;
constexpr int kVecSize = 4;
constexpr int kRopeLanes = kRopeDim / kVecSize;  // last 16 lanes hold the rope tail
constexpr unsigned kFullMask = 0xffffffffu;

static_assert(kHeadDim == kWarpThreads * kVecSize, "one warp covers one head");

// Same byte layouts as sglang's device::compress::{DecodePlan, CompressPlan}.
struct alignas(16) DecodePlan {
  uint32_t seq_len;
  int32_t write_loc;
  int32_t read_page_0;
  int32_t read_page_1;
};

struct alignas(16) CompressPlan {
  uint32_t seq_len;
  uint16_t ragged_id;
  uint16_t buffer_len;
  int32_t read_page_0;
  int32_t read_page_1;
  __device__ bool is_invalid() const { return seq_len == 0xffffffffu; }
};

static_assert(sizeof(DecodePlan) == 16 && sizeof(CompressPlan) == 16, "plan layout");

struct alignas(8) Bf16x4 {
  __nv_bfloat162 lo, hi;
};

template <bool kIsDecode>
__global__ __launch_bounds__(kBlockSize) void index_k_store_bf16_kernel(
    const __nv_bfloat16* __restrict__ input,  // [num_tokens, 128]
    const void* __restrict__ plans,           // [num_tokens, 16] bytes
    const __nv_bfloat16* __restrict__ weight,  // [128]
    const float* __restrict__ freqs_cis,       // [max_pos, 64] = 32 (cos, sin) pairs
    const int64_t* __restrict__ out_loc,       // decode: [num_tokens]; extend: indexed by ragged_id
    __nv_bfloat16* __restrict__ kvcache,       // [num_slots, 128] bf16 (pages of [64, 1, 128])
    float eps,
    uint32_t compress_ratio,
    uint32_t num_tokens) {
  const int warp_id = threadIdx.x / kWarpThreads;
  const int lane_id = threadIdx.x % kWarpThreads;
  const uint32_t work_id = blockIdx.x * kNumWarps + warp_id;
  const bool is_rope_lane = lane_id >= kWarpThreads - kRopeLanes;
  // Every exit below is warp-uniform (work_id is per warp), so the shuffles stay full-warp.
  if (work_id >= num_tokens) return;

  int32_t position;
  int64_t loc;
  if constexpr (kIsDecode) {
    const DecodePlan plan = static_cast<const DecodePlan*>(plans)[work_id];
    if (plan.seq_len % compress_ratio != 0) return;  // no compressed token completes this step
    position = static_cast<int32_t>(plan.seq_len - compress_ratio);
    loc = out_loc[work_id];
  } else {
    const CompressPlan plan = static_cast<const CompressPlan*>(plans)[work_id];
    if (plan.is_invalid()) return;
    position = static_cast<int32_t>(plan.seq_len - compress_ratio);
    loc = out_loc[plan.ragged_id];
  }

  // part 1: RMSNorm in fp32
  const Bf16x4 in4 = reinterpret_cast<const Bf16x4*>(input + static_cast<int64_t>(work_id) * kHeadDim)[lane_id];
  const Bf16x4 w4 = reinterpret_cast<const Bf16x4*>(weight)[lane_id];
  float x[kVecSize] = {__low2float(in4.lo), __high2float(in4.lo), __low2float(in4.hi), __high2float(in4.hi)};
  const float w[kVecSize] = {__low2float(w4.lo), __high2float(w4.lo), __low2float(w4.hi), __high2float(w4.hi)};
  float4 freq = make_float4(0.f, 0.f, 0.f, 0.f);
  if (is_rope_lane) {
    freq = reinterpret_cast<const float4*>(freqs_cis + static_cast<int64_t>(position) * kRopeDim)
        [lane_id - (kWarpThreads - kRopeLanes)];
  }
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kVecSize; ++i) ss += x[i] * x[i];
#pragma unroll
  for (int m = kWarpThreads / 2; m > 0; m >>= 1) ss += __shfl_xor_sync(kFullMask, ss, m);
  const float norm = rsqrtf(ss / kHeadDim + eps);
#pragma unroll
  for (int i = 0; i < kVecSize; ++i) x[i] = x[i] * norm * w[i];

  // part 2: RoPE on the rope tail, 2 (real, imag) pairs per lane
  if (is_rope_lane) {
    const float a0 = x[0], a1 = x[1], b0 = x[2], b1 = x[3];
    x[0] = a0 * freq.x - a1 * freq.y;
    x[1] = a0 * freq.y + a1 * freq.x;
    x[2] = b0 * freq.z - b1 * freq.w;
    x[3] = b0 * freq.w + b1 * freq.z;
  }

  // part 3: Hadamard transform over the 128 dims (bits 0-1 in-lane, bits 2-6 across lanes)
  {
    float a0 = x[0], a1 = x[1], a2 = x[2], a3 = x[3];
    x[0] = a0 + a1;
    x[1] = a0 - a1;
    x[2] = a2 + a3;
    x[3] = a2 - a3;
    a0 = x[0], a1 = x[1], a2 = x[2], a3 = x[3];
    x[0] = a0 + a2;
    x[1] = a1 + a3;
    x[2] = a0 - a2;
    x[3] = a1 - a3;
#pragma unroll
    for (int mask = 1; mask < kWarpThreads; mask <<= 1) {
#pragma unroll
      for (int i = 0; i < kVecSize; ++i) {
        const float other = __shfl_xor_sync(kFullMask, x[i], mask);
        x[i] = (lane_id & mask) ? (other - x[i]) : (x[i] + other);
      }
    }
    const float scale = rsqrtf(static_cast<float>(kHeadDim));
#pragma unroll
    for (int i = 0; i < kVecSize; ++i) x[i] *= scale;
  }

  // part 4: bf16 store, 8 bytes per lane, 256 contiguous bytes per token
  Bf16x4 out;
  out.lo = __floats2bfloat162_rn(x[0], x[1]);
  out.hi = __floats2bfloat162_rn(x[2], x[3]);
  reinterpret_cast<Bf16x4*>(kvcache + loc * kHeadDim)[lane_id] = out;
}

}  // namespace pdstack

extern "C" {

// Bumped when a launcher's arguments change or one is added; the Python loader checks it.
// 2: pdstack_topk_transform (topk512.cu) added. 3: it removed again (SGLang's own top-k is as fast or faster at
// the sizes decode and prefill use: kernels/BENCHMARKS.md).
int pdstack_kernels_abi_version() { return 3; }

// Returns a cudaError_t (0 = success). All pointers are device pointers; `plans` is
// [num_tokens, 16] bytes of DecodePlan (is_decode != 0) or CompressPlan (is_decode == 0).
int pdstack_index_k_store_bf16(
    const void* input,
    const void* plans,
    const void* weight,
    const float* freqs_cis,
    const int64_t* out_loc,
    void* kvcache,
    float eps,
    uint32_t compress_ratio,
    uint32_t num_tokens,
    int is_decode,
    cudaStream_t stream) {
  if (num_tokens == 0) return static_cast<int>(cudaSuccess);
  if (compress_ratio == 0) return static_cast<int>(cudaErrorInvalidValue);
  const dim3 grid((num_tokens + pdstack::kNumWarps - 1) / pdstack::kNumWarps);
  const dim3 block(pdstack::kBlockSize);
  const auto* in = static_cast<const __nv_bfloat16*>(input);
  const auto* w = static_cast<const __nv_bfloat16*>(weight);
  auto* cache = static_cast<__nv_bfloat16*>(kvcache);
  if (is_decode) {
    pdstack::index_k_store_bf16_kernel<true>
        <<<grid, block, 0, stream>>>(in, plans, w, freqs_cis, out_loc, cache, eps, compress_ratio, num_tokens);
  } else {
    pdstack::index_k_store_bf16_kernel<false>
        <<<grid, block, 0, stream>>>(in, plans, w, freqs_cis, out_loc, cache, eps, compress_ratio, num_tokens);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
