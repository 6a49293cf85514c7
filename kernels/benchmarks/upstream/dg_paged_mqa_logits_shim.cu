// DeepGEMM's fp8 paged MQA logits (sgl-deep-gemm 0.2.3.post2) on sm_90, without its torch extension.
//
// Why a shim: the wheel's deep_gemm/_C.so links libtorch 2.14 and does not load beside torch 2.11 (the H200's),
// and the C++ host sources of that exact wheel are not published in a repository we can fetch (sgl-project/DeepGEMM's
// newest stored branch, dev @ 2176dff, Jun 2026, is older). The KERNELS are the wheel's own: this file includes
// deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh and deep_gemm/scheduler/sm90_paged_mqa_logits.cuh from the wheel's
// deep_gemm/include, unchanged. The host side below reproduces DeepGEMM's (dev @ 2176dff
// csrc/jit_kernels/impls/smxx_fp8_fp4_paged_mqa_logits.hpp and csrc/apis/attention.hpp, whose kernel
// templates and arguments match the wheel's headers): split_kv 256, 4 math warpgroups (512 threads) + 128 TMA
// threads, 3 q stages, 3 kv stages, grid = num_sms, logits stride aligned to 256, the same TMA descriptors
// (128 B swizzle on q/k) and shared-memory size, no PDL (DeepGEMM's default), clean_logits=False (SGLang's call).
// Kernels are instantiated at build time for 132 SMs (H200 SXM) instead of JIT-compiled per call.
#include <cuda.h>
#include <cuda_runtime.h>

#include <deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh>

#include <cstdint>

namespace {

constexpr uint32_t kNumSMs = 132;
constexpr uint32_t kSplitKV = 256, kBlockKV = 64, kHeads = 64, kHeadDim = 128;
constexpr uint32_t kTMAThreads = 128, kMathThreads = 512, kQStages = 3, kKVStages = 3;

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_fn() {
  static EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

int tma(CUtensorMap* m, CUtensorMapDataType dt, int rank, void* ptr, const cuuint64_t* dims, const cuuint64_t* strides,
        const cuuint32_t* box, CUtensorMapSwizzle sw) {
  const cuuint32_t elem[3] = {1, 1, 1};
  auto fn = encode_fn();
  if (fn == nullptr) return 1000;
  const CUresult r = fn(m, dt, rank, ptr, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : 1000 + static_cast<int>(r);
}

template <uint32_t kAligned>
int launch_meta(const int* context_lens, int* meta, int batch, cudaStream_t s) {
  auto kernel = deep_gemm::sched::sm90_paged_mqa_logits_metadata<kAligned, kSplitKV, kNumSMs, false>;
  const int smem = (3 * kAligned + 1) * sizeof(int);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(32);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<uint32_t>(batch), 1u, true,
                            reinterpret_cast<const uint32_t*>(context_lens), static_cast<const uint32_t*>(nullptr),
                            reinterpret_cast<uint32_t*>(meta));
}

}  // namespace

extern "C" {

int pdk_dg_num_sms() { return kNumSMs; }

// context_lens: int32 [B, 1]; schedule_meta: int32 [num_sms + 1, 2]
int pdk_dg_paged_mqa_logits_metadata(const int* context_lens, int* schedule_meta, int batch, cudaStream_t stream) {
  if (batch <= 0 || batch > 256) return 2000;
  const uint32_t aligned = (batch + 31) / 32 * 32;
  switch (aligned) {
    case 32: return launch_meta<32>(context_lens, schedule_meta, batch, stream);
    case 64: return launch_meta<64>(context_lens, schedule_meta, batch, stream);
    case 96: return launch_meta<96>(context_lens, schedule_meta, batch, stream);
    case 128: return launch_meta<128>(context_lens, schedule_meta, batch, stream);
    case 160: return launch_meta<160>(context_lens, schedule_meta, batch, stream);
    case 192: return launch_meta<192>(context_lens, schedule_meta, batch, stream);
    case 224: return launch_meta<224>(context_lens, schedule_meta, batch, stream);
    default: return launch_meta<256>(context_lens, schedule_meta, batch, stream);
  }
}

// q: fp8 e4m3 [B, 1, 64, 128] contiguous; fused_kv: uint8 [num_blocks, 64, 1, 132] (64*128 fp8 then 64 fp32 scales
// per block, block stride kv_block_stride bytes); weights fp32 [B, 64]; context_lens int32 [B, 1]; logits fp32
// [B, logits_stride] with logits_stride % 256 == 0; block_table int32 [B, block_table_stride].
int pdk_dg_fp8_paged_mqa_logits(void* q, void* fused_kv, void* weights, const int* context_lens, float* logits,
                                const int* block_table, const int* schedule_meta, int batch, int num_blocks,
                                long kv_block_stride, int logits_stride, int block_table_stride, cudaStream_t stream) {
  if (logits_stride % kSplitKV != 0 || kv_block_stride % 16 != 0) return 2001;
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (sms != static_cast<int>(kNumSMs)) return 2002;

  CUtensorMap tq, tkv, tsc, tw;
  int err;
  {  // q: 2D {head_dim, B * next_n * heads}, box {128 (swizzle 128 / 1 B), next_n_atom * heads}
    const cuuint64_t dims[2] = {kHeadDim, static_cast<cuuint64_t>(batch) * kHeads};
    const cuuint64_t strides[1] = {kHeadDim};
    const cuuint32_t box[2] = {128, kHeads};
    if ((err = tma(&tq, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, q, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B))) return err;
  }
  {  // kv: 3D {head_dim, block_kv, num_blocks}, strides {head_dim, block stride} bytes, box {128, block_kv, 1}
    const cuuint64_t dims[3] = {kHeadDim, kBlockKV, static_cast<cuuint64_t>(num_blocks)};
    const cuuint64_t strides[2] = {kHeadDim, static_cast<cuuint64_t>(kv_block_stride)};
    const cuuint32_t box[3] = {128, kBlockKV, 1};
    if ((err = tma(&tkv, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, fused_kv, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B)))
      return err;
  }
  {  // scales: fp32 2D {block_kv, num_blocks} at byte offset block_kv * head_dim, box {block_kv, 1}
    const cuuint64_t dims[2] = {kBlockKV, static_cast<cuuint64_t>(num_blocks)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kv_block_stride)};
    const cuuint32_t box[2] = {kBlockKV, 1};
    void* base = static_cast<uint8_t*>(fused_kv) + kBlockKV * kHeadDim;
    if ((err = tma(&tsc, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, base, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE)))
      return err;
  }
  {  // weights: fp32 2D {heads, B * next_n}, box {heads, next_n_atom}
    const cuuint64_t dims[2] = {kHeads, static_cast<cuuint64_t>(batch)};
    const cuuint64_t strides[1] = {kHeads * sizeof(float)};
    const cuuint32_t box[2] = {kHeads, 1};
    if ((err = tma(&tw, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, weights, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE)))
      return err;
  }

  // shared memory, as DeepGEMM's host computes it for arch 9
  constexpr int swz = kHeadDim * 8;
  auto align = [](int x, int a) { return (x + a - 1) / a * a; };
  const int q_stage = kHeads * kHeadDim, w_stage = align(kHeads * 4, swz);
  const int q_pipe = kQStages * (q_stage + w_stage) + align(kQStages * 8 * 2, swz);
  const int kv_stage = kBlockKV * kHeadDim, sc_stage = align(kBlockKV * 4, swz);
  const int kv_pipe = kKVStages * (kv_stage + sc_stage) + align(kKVStages * 8 * 2, swz);
  constexpr int wgs = kMathThreads / 128;
  const int smem = q_pipe + wgs * kv_pipe + wgs * 2 * 8 + 4;

  auto kernel = deep_gemm::sm90_fp8_paged_mqa_logits<1, kHeads, kHeadDim, kBlockKV, true, false, kQStages, kKVStages,
                                                     kSplitKV, kTMAThreads, kMathThreads, float>;
  static bool attr_set = false;
  if (!attr_set) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) return 2003;
    attr_set = true;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(kNumSMs);
  cfg.blockDim = dim3(kTMAThreads + kMathThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<uint32_t>(batch), static_cast<uint32_t>(logits_stride),
                            static_cast<uint32_t>(block_table_stride), reinterpret_cast<const uint32_t*>(context_lens),
                            logits, reinterpret_cast<const uint32_t*>(block_table),
                            static_cast<const uint32_t*>(nullptr), reinterpret_cast<const uint32_t*>(schedule_meta),
                            tq, tkv, tsc, tw);
}

}  // extern "C"
