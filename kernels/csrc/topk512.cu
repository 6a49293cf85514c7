// Top-k (k <= 2048, DeepSeek-V4: 512) selection over indexer logits + transform to physical KV slots,
// in ONE launch: one 1024-thread CTA per row, exact radix select.
//
// Same contract as pdstack_kernels/topk.py (and upstream's topk_transform_paged, jit topk_v1.cuh):
// n = clamp(seq_lens[b], 0, width); rows with n <= k take positions 0..n-1 in order, -1 after; longer rows
// take exactly the k largest of logits[b, :n] in no particular order (ties at the threshold arbitrary).
// Position i becomes page_table[b, i >> page_bits] << page_bits | (i & (page_size - 1)). Positions >= n are
// never read (NaN there cannot leak). NaN logits below n are unsupported (as upstream).
//
// Algorithm (in the spirit of SGLang's topk_v2.cuh, without clusters):
//  pass 0   read the row from global memory once (float4, 4 loads in flight per thread), map every float
//           to an order-preserving uint32 key, histogram its top 11 bits in shared memory (2048 bins); when
//           the row fits in the dynamic shared memory (<= ~56K keys on an H200) the keys are staged there.
//  resolve  a block suffix scan of the histogram finds the bucket that holds the k-th largest key
//           (prefix), how many of it are still to be taken (k_rem) and whether it is taken whole (done).
//  staged   further 8/8/5-bit passes over the shared-memory keys that match the prefix, then one write pass.
//  not staged  one more global read compacts the threshold bucket's (key, index) pairs into shared memory
//           and writes every key above the bucket at once; further passes and the write run on the
//           candidates. If the bucket overflows the candidate buffer, the passes re-read global memory.
// Output slots come from two shared counters claimed per warp (ballot + one atomic): keys above the final
// prefix fill 0..k-k_rem-1, keys equal to it the last k_rem slots, kept while their rank < k_rem.
//
// Plain CUDA, no SGLang headers: built with the store kernel by pdstack_kernels.build into the same shared
// library and called through ctypes (pdstack_kernels/topk.py, backend="cuda").

#include <cuda_runtime.h>

#include <cstdint>

namespace pdstack {
namespace topk {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBits0 = 11;  // first pass: sign, exponent and 2 mantissa bits
constexpr int kBins0 = 1 << kBits0;
constexpr int kShift0 = 32 - kBits0;
constexpr int kBitsN = 8;  // later passes
constexpr int kUnroll = 4;  // float4 loads in flight per thread
constexpr unsigned kFull = 0xffffffffu;

struct Args {
  const float* logits;  // [B, width], row stride stride_l
  const int32_t* seq_lens;  // [B]
  const int32_t* page_table;  // [B, P], row stride stride_pt
  int32_t* out;  // [B, k]
  int32_t* raw;  // [B, k] or nullptr
  int64_t stride_l;
  int64_t stride_pt;
  int32_t width;
  int32_t k;
  int32_t page_bits;
  int32_t cap_keys;  // rows with n <= cap_keys are staged in shared memory
  int32_t cap_cand;  // candidate (key, index) pairs that fit in shared memory
};

__device__ __forceinline__ uint32_t ordered_key(float x) {
  const uint32_t bits = __float_as_uint(x);
  return bits ^ ((bits >> 31) ? 0xffffffffu : 0x80000000u);
}

// Claim one slot per lane with pred from *counter; every lane of the warp must call it.
__device__ __forceinline__ int warp_claim(bool pred, int* counter) {
  const int lane = threadIdx.x & 31;
  const unsigned mask = __ballot_sync(kFull, pred);
  if (mask == 0) return 0;
  const int leader = __ffs(mask) - 1;
  int base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(mask));
  base = __shfl_sync(kFull, base, leader);
  return base + __popc(mask & ((1u << lane) - 1u));
}

// f(i, x, ok) for every position i < n of row, warp-uniformly (lanes past n get ok = false).
template <class F>
__device__ __forceinline__ void scan_global(const float* __restrict__ row, int n, F&& f) {
  const int tid = threadIdx.x;
  const bool aligned = (reinterpret_cast<uintptr_t>(row) & 15u) == 0;
  const int nvec = aligned ? n / 4 : 0;
  const float4* row4 = reinterpret_cast<const float4*>(row);
  for (int base = 0; base < nvec; base += kThreads * kUnroll) {
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int q = base + u * kThreads + tid;
      v[u] = q < nvec ? __ldg(row4 + q) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int q = base + u * kThreads + tid;
      const bool ok = q < nvec;
      f(4 * q, v[u].x, ok);
      f(4 * q + 1, v[u].y, ok);
      f(4 * q + 2, v[u].z, ok);
      f(4 * q + 3, v[u].w, ok);
    }
  }
  for (int base = nvec * 4; base < n; base += kThreads) {
    const int i = base + tid;
    const bool ok = i < n;
    f(i, ok ? __ldg(row + i) : 0.f, ok);
  }
}

struct Selected {
  int digit, above, count;
};

// Bucket of hist[0..nbins) holding the k_rem-th largest key: every thread returns the same answer.
__device__ __forceinline__ Selected resolve(const int* hist, int nbins, int k_rem, int* warp_tot, Selected* sel) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = (nbins + kThreads - 1) / kThreads;  // 2 for 2048 bins, else 1
  const int lo = tid * per;
  int h[2] = {0, 0};
#pragma unroll
  for (int p = 0; p < 2; ++p)
    if (p < per && lo + p < nbins) h[p] = hist[lo + p];
  const int tsum = h[0] + h[1];
  int x = tsum;  // inclusive suffix sum over the warp's lanes
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int y = __shfl_down_sync(kFull, x, off);
    if (lane + off < 32) x += y;
  }
  if (lane == 0) warp_tot[warp] = x;
  __syncthreads();
  int above = x - tsum;
  for (int w = warp + 1; w < kWarps; ++w) above += warp_tot[w];
#pragma unroll
  for (int p = 1; p >= 0; --p) {
    if (p < per && lo + p < nbins) {
      if (above < k_rem && above + h[p] >= k_rem) *sel = Selected{lo + p, above, h[p]};
      above += h[p];
    }
  }
  __syncthreads();
  return *sel;
}

__global__ __launch_bounds__(kThreads, 1) void topk_transform_kernel(const Args a) {
  extern __shared__ uint4 dyn_smem[];
  __shared__ int hist[kBins0];
  __shared__ int warp_tot[kWarps];
  __shared__ Selected sel;
  __shared__ int gt_cnt, eq_cnt, ncand;

  const int tid = threadIdx.x;
  const int64_t b = blockIdx.x;
  const int K = a.k;
  const int n = min(max(a.seq_lens[b], 0), a.width);
  const float* __restrict__ row = a.logits + b * a.stride_l;
  const int32_t* __restrict__ pt_row = a.page_table + b * a.stride_pt;
  int32_t* __restrict__ out_row = a.out + b * K;
  int32_t* __restrict__ raw_row = a.raw ? a.raw + b * K : nullptr;
  const int page_bits = a.page_bits;
  const int page_mask = (1 << page_bits) - 1;

  auto emit = [&](int i, int pos) {
    out_row[pos] = (pt_row[i >> page_bits] << page_bits) | (i & page_mask);
    if (raw_row) raw_row[pos] = i;
  };

  if (n <= K) {  // short row: positions 0..n-1 in order, -1 after
    for (int i = tid; i < K; i += kThreads) {
      if (i < n) {
        emit(i, i);
      } else {
        out_row[i] = -1;
        if (raw_row) raw_row[i] = -1;
      }
    }
    return;
  }

  const bool staged = n <= a.cap_keys;
  uint32_t* keys = reinterpret_cast<uint32_t*>(dyn_smem);
  uint32_t* cand_key = keys;
  int32_t* cand_idx = reinterpret_cast<int32_t*>(keys + a.cap_cand);

  for (int t = tid; t < kBins0; t += kThreads) hist[t] = 0;
  if (tid == 0) gt_cnt = eq_cnt = ncand = 0;
  __syncthreads();

  // pass 0: top 11 bits, from global memory (staging the keys when they fit)
  scan_global(row, n, [&](int i, float x, bool ok) {
    if (ok) {
      const uint32_t key = ordered_key(x);
      if (staged) keys[i] = key;
      atomicAdd(&hist[key >> kShift0], 1);
    }
  });
  __syncthreads();
  Selected s = resolve(hist, kBins0, K, warp_tot, &sel);
  uint32_t prefix = static_cast<uint32_t>(s.digit);  // resolved high 32 - shift bits of the k-th key
  int shift = kShift0;
  int k_rem = K - s.above;  // keys equal to prefix still to take
  bool done = s.count == k_rem;  // the bucket is taken whole
  const uint32_t prefix0 = prefix;

  // one radix pass over the keys that match prefix, fed by for_each(f) with f(ok, key, i)
  auto hist_pass = [&](auto&& for_each) {
    const int w = min(kBitsN, shift);
    const int new_shift = shift - w;
    const int nbins = 1 << w;
    for (int t = tid; t < nbins; t += kThreads) hist[t] = 0;
    __syncthreads();
    for_each([&](bool ok, uint32_t key, int) {
      if (ok && (key >> shift) == prefix) atomicAdd(&hist[(key >> new_shift) & (nbins - 1)], 1);
    });
    __syncthreads();
    const Selected r = resolve(hist, nbins, k_rem, warp_tot, &sel);
    prefix = (prefix << w) | static_cast<uint32_t>(r.digit);
    shift = new_shift;
    k_rem -= r.above;
    done = r.count == k_rem || shift == 0;
  };
  // the write: keys above prefix take slots from gt_cnt, keys equal to it the last k_rem (rank < k_rem)
  auto write_one = [&](bool ok, uint32_t key, int i) {
    const uint32_t hi = key >> shift;
    const bool gt = ok && hi > prefix;
    const bool eq = ok && hi == prefix;
    const int pg = warp_claim(gt, &gt_cnt);
    if (gt) emit(i, pg);
    const int re = warp_claim(eq, &eq_cnt);
    if (eq && re < k_rem) emit(i, K - k_rem + re);
  };
  auto for_staged = [&](auto&& f) {
    for (int base = 0; base < n; base += kThreads) {
      const int j = base + tid;
      const bool ok = j < n;
      f(ok, ok ? keys[j] : 0u, j);
    }
  };
  auto for_global = [&](auto&& f) {
    scan_global(row, n, [&](int i, float x, bool ok) { f(ok, ordered_key(x), i); });
  };

  if (staged) {
    while (!done) hist_pass(for_staged);
    for_staged(write_one);
    return;
  }
  if (done) {
    for_global(write_one);
    return;
  }
  // compaction: keys above the threshold bucket are written now, the bucket's keys become candidates
  const int cap_cand = a.cap_cand;
  for_global([&](bool ok, uint32_t key, int i) {
    const uint32_t hi = key >> kShift0;
    const bool gt = ok && hi > prefix0;
    const bool eq = ok && hi == prefix0;
    const int pg = warp_claim(gt, &gt_cnt);
    if (gt) emit(i, pg);
    const int c = warp_claim(eq, &ncand);
    if (eq && c < cap_cand) {
      cand_key[c] = key;
      cand_idx[c] = i;
    }
  });
  __syncthreads();
  const int m = ncand;
  if (m <= cap_cand) {
    auto for_cand = [&](auto&& f) {
      for (int base = 0; base < m; base += kThreads) {
        const int j = base + tid;
        const bool ok = j < m;
        f(ok, ok ? cand_key[j] : 0u, ok ? cand_idx[j] : 0);
      }
    };
    while (!done) hist_pass(for_cand);
    for_cand(write_one);
  } else {  // the bucket overflows the candidate buffer: passes over global memory, bucket keys only
    while (!done) hist_pass(for_global);
    for_global([&](bool ok, uint32_t key, int i) { write_one(ok && (key >> kShift0) == prefix0, key, i); });
  }
}

}  // namespace topk
}  // namespace pdstack

extern "C" {

// Returns a cudaError_t (0 = success). Pointers are device pointers (raw may be null). max_staged /
// max_cand < 0: as many keys / candidate pairs as the opt-in shared memory holds; >= 0 caps them (tests).
int pdstack_topk_transform(
    const float* logits,
    const int32_t* seq_lens,
    const int32_t* page_table,
    int32_t* out,
    int32_t* raw,
    int64_t stride_l,
    int64_t stride_pt,
    int32_t batch,
    int32_t width,
    int32_t k,
    int32_t page_bits,
    int32_t max_staged,
    int32_t max_cand,
    cudaStream_t stream) {
  using namespace pdstack::topk;
  if (batch <= 0) return static_cast<int>(cudaSuccess);
  if (k <= 0 || k > 2048 || width < 0 || page_bits < 0 || page_bits > 30)
    return static_cast<int>(cudaErrorInvalidValue);
  constexpr int kMaxDevices = 64;
  static int avail_bytes[kMaxDevices];  // dynamic shared memory set as the kernel's maximum, per device
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (dev >= kMaxDevices) return static_cast<int>(cudaErrorInvalidDevice);
  if (avail_bytes[dev] == 0) {
    int optin = 0;
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (err != cudaSuccess) return static_cast<int>(err);
    cudaFuncAttributes fa{};
    err = cudaFuncGetAttributes(&fa, topk_transform_kernel);
    if (err != cudaSuccess) return static_cast<int>(err);
    const int avail = (optin - static_cast<int>(fa.sharedSizeBytes)) & ~15;
    err = cudaFuncSetAttribute(topk_transform_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, avail);
    if (err != cudaSuccess) return static_cast<int>(err);
    avail_bytes[dev] = avail;
  }
  const int avail = avail_bytes[dev];
  Args a{logits, seq_lens, page_table, out, raw, stride_l, stride_pt, width, k, page_bits, 0, 0};
  int dyn;
  if (static_cast<int64_t>(width) * 4 <= avail) {
    dyn = ((width * 4 + 15) & ~15);
    a.cap_keys = width;
  } else {
    dyn = avail;
    a.cap_keys = avail / 4;
  }
  a.cap_cand = dyn / 8;
  if (max_staged >= 0 && max_staged < a.cap_keys) a.cap_keys = max_staged;
  if (max_cand >= 0 && max_cand < a.cap_cand) a.cap_cand = max_cand;
  topk_transform_kernel<<<batch, kThreads, dyn, stream>>>(a);
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
