// CAKE device runtime: one inline-PTX wrapper per instruction the IR can emit.
// Self-contained (NVRTC has no CUDA headers): no includes, bf16/f16 kept as raw 16-bit storage.
// Shared-memory addresses are 32-bit shared-window addresses throughout.
#pragma once
#define CAKE_RUNTIME_VERSION 4

namespace cake {

typedef unsigned short bf16;
typedef unsigned short f16;
typedef unsigned long long u64;

struct __align__(64) TensorMap { u64 opaque[16]; };  // CUtensorMap, filled by the host

__device__ __forceinline__ float inf() { return __int_as_float(0x7f800000); }

// ----------------------------------------------------------------------------- conversions
__device__ __forceinline__ float bf2f(bf16 x) { return __uint_as_float(((unsigned)x) << 16); }
__device__ __forceinline__ bf16 f2bf(float x) {
  unsigned short r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x)); return r;
}
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ float h2f(f16 x) { float r; asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(x)); return r; }
__device__ __forceinline__ f16 f2h(float x) { unsigned short r; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x)); return r; }
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {
  unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ float sq(float x) { return x * x; }
// onehot: two ints as an f16x2 pair (nearest), an f16x2 equality as 1.0 / 0.0 halves (one HSET2: the
// f16 one-hot pair), and f16's 1.0 (0x3C00) turned into bf16's (0x3F80) in both halves
__device__ __forceinline__ unsigned i2h2(int lo, int hi) {
  unsigned short l, h;
  asm("cvt.rn.f16.s32 %0, %1;" : "=h"(l) : "r"(lo));
  asm("cvt.rn.f16.s32 %0, %1;" : "=h"(h) : "r"(hi));
  return (unsigned)l | ((unsigned)h << 16);
}
__device__ __forceinline__ unsigned heq2(unsigned a, unsigned b) {
  unsigned d; asm("set.eq.f16x2.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}
__device__ __forceinline__ unsigned h1_to_bf1(unsigned x) { return x | ((x >> 3) & 0x03800380u); }
// Fast forms, within a few ulp: exp / 1/x / 1/sqrt(x) as one MUFU op each, flushing subnormal results
// to 0 (.ftz). The non-ftz forms (__expf, rsqrtf) add a range test and two rescaling multiplies per
// call, and IEEE 1/x or log1pf are slow-path calls of ~30 instructions: in the SASS of the KDA kernels
// that was a third of the instructions. sigmoid and softplus are 0 / x past the fp32 range as they should be.
__device__ __forceinline__ float fexp(float x) {
  float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.4426950408889634f)); return r;
}
__device__ __forceinline__ float frcp(float x) { float r; asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
__device__ __forceinline__ float frsqrt(float x) { float r; asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
__device__ __forceinline__ float sigmoidf(float x) { return frcp(1.0f + fexp(-x)); }
// softplus(x) = max(x, 0) + log1p(e^-|x|), branch-free (9-12 instructions; the ternary form with __logf
// was 17 per element, a sixth of the KDA softplus prepare kernel): log1p(u) is a cubic below u = 2^-5
// (error u^4 / 4) and ln 2 * lg2(1 + u) above it, so the result is within ~1e-5 relative for every x.
__device__ __forceinline__ float flg2(float x) { float r; asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }
__device__ __forceinline__ float softplusf(float x) {
  float u = fexp(-fabsf(x));
  float small = u * (1.0f - u * (0.5f - u * 0.33333333f));
  float l = u < 0.03125f ? small : 0.69314718f * flg2(1.0f + u);
  return fmaxf(x, 0.0f) + l;
}

// ----------------------------------------------------------------------------- addresses
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}
// The TMA/wgmma swizzle on a byte offset from a 1024-byte aligned base: bits [4,4+B) ^= bits [7,7+B).
template <int B> __device__ __forceinline__ unsigned swz(unsigned x) {
  return B == 0 ? x : (x ^ (((x >> 7) & ((1u << B) - 1u)) << 4));
}

// ----------------------------------------------------------------------------- thread groups
__device__ __forceinline__ bool elect_one_sync() {
#if __CUDA_ARCH__ >= 900
  unsigned pred = 0;
  asm volatile("{\n .reg .pred p;\n elect.sync _|p, 0xffffffff;\n selp.u32 %0, 1, 0, p;\n}\n" : "=r"(pred));
  return pred != 0;
#else
  return (threadIdx.x & 31) == 0;
#endif
}
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(threads) : "memory");
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
#if __CUDA_ARCH__ >= 900
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N));
#endif
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
#if __CUDA_ARCH__ >= 900
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N));
#endif
}

// ----------------------------------------------------------------------------- fences
__device__ __forceinline__ void fence_proxy_async() {
#if __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
__device__ __forceinline__ void fence_mbarrier_init() {
#if __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void fence_acq_rel_cta() { asm volatile("fence.acq_rel.cta;" ::: "memory"); }
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// ----------------------------------------------------------------------------- mbarrier
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n"
               :: "r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n" :: "r"(bar), "r"(parity) : "memory");
#else
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.test_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n" :: "r"(bar), "r"(parity) : "memory");
#endif
}
// arrive once on the mbarrier at shared offset `bar` of cluster CTA `cta` (this CTA's own included). The default
// (.release.cta) semantics: an explicit .release.cluster fence costs a memory-barrier stall per arrive (ncu, the
// k-means CTA pairs), and the reads it releases are the consumer's completed wgmma reads of its own shared memory.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned cta) {
#if __CUDA_ARCH__ >= 900
  asm volatile("{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %0, %1;\n"
               " mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" :: "r"(bar), "r"(cta) : "memory");
#endif
}
// every thread of every CTA of the cluster: arrive (release), then wait (acquire)
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async_arrive(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(bar) : "memory");
}

// ----------------------------------------------------------------------------- cp.async
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid = true) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async8(unsigned dst, const void* src, bool valid = true) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" :: "r"(dst), "l"(src), "r"(valid ? 8 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, bool valid = true) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

// ----------------------------------------------------------------------------- TMA
__device__ __forceinline__ void tma_load_1d(unsigned dst, const TensorMap* m, int c0, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2}], [%3];"
               :: "r"(dst), "l"(m), "r"(c0), "r"(bar) : "memory");
}
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TensorMap* m, int c0, int c1, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               :: "r"(dst), "l"(m), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
__device__ __forceinline__ void tma_load_3d(unsigned dst, const TensorMap* m, int c0, int c1, int c2, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
               :: "r"(dst), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}
// multicast: the box lands at `dst` and completes on `bar` (same offsets) in every CTA whose bit is in `mask`
__device__ __forceinline__ void tma_load_1d_mc(unsigned dst, const TensorMap* m, int c0, unsigned bar, unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2}], [%3], %4;" :: "r"(dst), "l"(m), "r"(c0), "r"(bar), "h"(mask) : "memory");
}
__device__ __forceinline__ void tma_load_2d_mc(unsigned dst, const TensorMap* m, int c0, int c1, unsigned bar,
                                               unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2, %3}], [%4], %5;" :: "r"(dst), "l"(m), "r"(c0), "r"(c1), "r"(bar), "h"(mask) : "memory");
}
__device__ __forceinline__ void tma_load_3d_mc(unsigned dst, const TensorMap* m, int c0, int c1, int c2, unsigned bar,
                                               unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2, %3, %4}], [%5], %6;"
               :: "r"(dst), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask) : "memory");
}
// the non-tensor bulk copy: `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to
// shared memory, completing as transaction bytes on the mbarrier at `bar` (copy kind bulk_load)
__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void tma_store_1d(const TensorMap* m, unsigned src, int c0) {
  asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.bulk_group [%0, {%2}], [%1];"
               :: "l"(m), "r"(src), "r"(c0) : "memory");
}
__device__ __forceinline__ void tma_store_2d(const TensorMap* m, unsigned src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               :: "l"(m), "r"(src), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tma_store_3d(const TensorMap* m, unsigned src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];"
               :: "l"(m), "r"(src), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void tma_store_wait() {
  asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
}

// ----------------------------------------------------------------------------- ldmatrix / mma.sync
__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(unsigned addr, unsigned& r0, unsigned& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned addr, unsigned& r0, unsigned& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void mma_16816_bf16(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_16816_f16(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ----------------------------------------------------------------------------- wgmma
// Shared-memory matrix descriptor (PTX ISA "matrix descriptor"): start address, leading and stride
// byte offsets (>>4) and the swizzle mode (1 = 128B, 2 = 64B, 3 = 32B).
__device__ __forceinline__ u64 wgmma_desc(unsigned addr, unsigned lbo, unsigned sbo, unsigned swizzle) {
  u64 d = 0;
  d |= (u64)((addr & 0x3FFFF) >> 4);
  d |= (u64)((lbo & 0x3FFFF) >> 4) << 16;
  d |= (u64)((sbo & 0x3FFFF) >> 4) << 32;
  d |= (u64)swizzle << 62;
  return d;
}
// The descriptor of the tile `bytes` (a multiple of 16) further on: only the start-address field (bits 0-13,
// address >> 4) moves, and a shared-memory address stays below 2^18, so it never carries into the next field.
// One 32-bit add where a whole descriptor costs ~4 uniform instructions: the lowering builds a buffer stage's
// descriptor once (the compiler shares it between statements) and steps it per tile row / column / k16 step.
__device__ __forceinline__ u64 wgmma_desc_add(u64 d, unsigned bytes) {
  return ((d >> 32) << 32) | (u64)((unsigned)d + (bytes >> 4));
}
__device__ __forceinline__ void wgmma_fence() {
#if __CUDA_ARCH__ >= 900
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if __CUDA_ARCH__ >= 900
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
#endif
}
// Keeps the compiler from moving accumulator reads/writes across async wgmma.
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r) :: "memory"); }

// ----------------------------------------------------------------------------- reductions
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Sums each of R values (R a power of two, 2..32) over the warp; every lane gets all R totals. A
// reduce-scatter halves the rows per shuffle level (R - 1 shuffles instead of 5 R), a butterfly
// finishes the lanes that share a row, and R shuffles gather the totals back: 2 R + 4 - log2 R
// shuffles in all where R separate warp_sum calls take 5 R.
__host__ __device__ constexpr int ilog2(int x) { return x <= 1 ? 0 : 1 + ilog2(x >> 1); }
// One reduce-scatter level: H live rows halve over lane bit 32 H / R (template recursion keeps every
// index a compile-time constant; loops over a run-time level count put the array on the stack).
template <int R, int H> struct SumRowsLevel {
  static __device__ __forceinline__ void run(float (&v)[R], int lane) {
    constexpr int O = 32 * H / R;
    const bool up = (lane & O) != 0;    // this lane keeps the upper half of the live rows
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const float send = up ? v[i] : v[i + H];
      const float keep = up ? v[i + H] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
    SumRowsLevel<R, H / 2>::run(v, lane);
  }
};
template <int R> struct SumRowsLevel<R, 0> {
  static __device__ __forceinline__ void run(float (&)[R], int) {}
};
template <int R> __device__ __forceinline__ void warp_sum_rows(float (&v)[R]) {
  static_assert(R >= 2 && R <= 32 && (R & (R - 1)) == 0, "warp_sum_rows: R a power of two in [2, 32]");
  const int lane = threadIdx.x & 31;
  SumRowsLevel<R, R / 2>::run(v, lane);
  // v[0] now sums row (lane >> (5 - log2 R)) over the lanes that differ in the top bits; finish it
#pragma unroll
  for (int o = 16 / R; o > 0; o >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
  const float t = v[0];
#pragma unroll
  for (int r = 0; r < R; ++r) v[r] = __shfl_sync(0xffffffffu, t, r << (5 - ilog2(R)));
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_min(float v) {
  v = fminf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fminf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}


// ----------------------------------------------------------------------------- selection (topk)
// Lists are sorted best first; (value, index) pairs are totally ordered (ties: smaller index wins),
// so lanes merging the same candidates agree. Every index below is static after unrolling, so the
// lists stay in registers.
template <bool MIN> __device__ __forceinline__ bool topk_better(float v, int i, float w, int j) {
  return MIN ? (v < w || (v == w && i < j)) : (v > w || (v == w && i < j));
}
template <int K, bool MIN> __device__ __forceinline__ void topk_insert(float* vals, int* idx, float v, int i) {
  if (!topk_better<MIN>(v, i, vals[K - 1], idx[K - 1])) return;   // the threshold test: one compare
  // A shift, not a bubble: each slot compares the new entry with the entry above it as it was (slots
  // are rewritten from the bottom up, so vals[q - 1] is still unchanged when slot q reads it). The K - 1
  // compares are independent, where the bubble's swaps were one dependent chain (a divergent insert runs
  // on one lane, so its latency was the warp's), and a slot costs 4 selects instead of 8.
  bool below = true;   // the new entry beats the entry now in slot q
#pragma unroll
  for (int q = K - 1; q > 0; --q) {
    const bool up = topk_better<MIN>(v, i, vals[q - 1], idx[q - 1]);   // it also beats slot q - 1's
    vals[q] = up ? vals[q - 1] : (below ? v : vals[q]);
    idx[q] = up ? idx[q - 1] : (below ? i : idx[q]);
    below = up;
  }
  if (below) { vals[0] = v; idx[0] = i; }
}
// Deferred insertion: a lane's queue of pending entries (index -1 = empty), newest first. Pushing is a
// shift (2 T moves, no compares); the caller checks that the last entry is empty first.
template <int T> __device__ __forceinline__ void topk_push(float* qv, int* qi, float v, int i) {
#pragma unroll
  for (int t = T - 1; t > 0; --t) { qv[t] = qv[t - 1]; qi[t] = qi[t - 1]; }
  qv[0] = v; qi[0] = i;
}
// Insert the queued entries and empty the queue. Called by the whole warp together, so the lanes
// share each entry's k steps (an entry slot costs the warp once, whichever lanes have one there).
template <int K, int T, bool MIN> __device__ __forceinline__ void topk_flush(float* vals, int* idx, float* qv, int* qi) {
#pragma unroll
  for (int t = 0; t < T; ++t) {
    if (qi[t] >= 0) topk_insert<K, MIN>(vals, idx, qv[t], qi[t]);
    qi[t] = -1;
  }
}
// A bound on a row's k-th best shared through a global word (the `topk` shared_bound): an
// order-preserving key, larger = tighter (an atomic max keeps the best), 0 = no bound. The monotone map
// e(f) flips a negative float's bits and sets a positive one's sign bit; min keeps ~e(f) (smaller f is
// tighter), max keeps e(f). The key 0 decodes to a NaN, which fminf / fmaxf ignore.
template <bool MIN> __device__ __forceinline__ unsigned bound_key(float f) {
  const unsigned u = __float_as_uint(f);
  const unsigned e = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return MIN ? ~e : e;
}
template <bool MIN> __device__ __forceinline__ float bound_value(unsigned key) {
  const unsigned e = MIN ? ~key : key;
  return __uint_as_float((e & 0x80000000u) ? (e & 0x7fffffffu) : ~e);
}
// Publish `mine` (one lane of the quad) when it is tighter than `shared`, the row's bound as read;
// returns the tighter of the two.
template <bool MIN> __device__ __forceinline__ float bound_publish(int* word, float mine, int lane, float shared) {
  const bool tighter = MIN ? !(shared <= mine) : !(shared >= mine);   // a NaN (no bound) is never tighter
  if (tighter && (lane & 3) == 0) atomicMax(reinterpret_cast<unsigned*>(word), bound_key<MIN>(mine));
  return MIN ? fminf(mine, shared) : fmaxf(mine, shared);
}
// Read the row's shared bound (L2: other CTAs' atomics land there; a stale value is only looser), then
// publish.
template <bool MIN> __device__ __forceinline__ float bound_share(int* word, float mine, int lane) {
  return bound_publish<MIN>(word, mine, lane, bound_value<MIN>((unsigned)__ldcg(word)));
}
// The same with the bound as last read (`cache`, a register): the read for the next call is issued now,
// so its latency hides behind the next tile's distances instead of stalling this filter.
template <bool MIN> __device__ __forceinline__ float bound_share_cached(int* word, float mine, int lane, float& cache) {
  const float thr = bound_publish<MIN>(word, mine, lane, cache);
  cache = bound_value<MIN>((unsigned)__ldcg(word));
  return thr;
}
// The best K of two sorted lists (best first), into (vals, idx): a bitonic merge. Against the other list
// reversed, each slot keeps the better of the pair, which leaves the best P of the 2 P entries as one
// bitonic sequence (P: K rounded up to a power of two, the tails padded with entries worse than any,
// index INT_MAX); log2 P half-cleaner stages of independent compare-exchanges sort it. ~P log2 P
// compare-exchanges with no dependent chain longer than log2 P + 1, where inserting the K entries one
// by one (topk_insert) costs K shifts of K slots; the same best K under topk_better's total order.
template <int K> struct topk_pow2 { static constexpr int P = K <= 1 ? 1 : 2 * topk_pow2<(K + 1) / 2>::P; };
template <> struct topk_pow2<1> { static constexpr int P = 1; };
template <int K, bool MIN> __device__ __forceinline__ void topk_merge_sorted(float* vals, int* idx, const float* ov,
                                                                         const int* oi) {
  constexpr int P = topk_pow2<K>::P;
  const float pad = MIN ? inf() : -inf();
  float c[P]; int ci[P];
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const float a = q < K ? vals[q] : pad;
    const int ai = q < K ? idx[q] : 0x7fffffff;
    const float b = P - 1 - q < K ? ov[P - 1 - q] : pad;
    const int bi = P - 1 - q < K ? oi[P - 1 - q] : 0x7fffffff;
    const bool take_b = topk_better<MIN>(b, bi, a, ai);
    c[q] = take_b ? b : a;
    ci[q] = take_b ? bi : ai;
  }
#pragma unroll
  for (int s = P / 2; s > 0; s >>= 1) {
#pragma unroll
    for (int q = 0; q < P; ++q) {
      if ((q & s) == 0) {
        const bool swap = topk_better<MIN>(c[q + s], ci[q + s], c[q], ci[q]);
        const float v = c[q]; const int i = ci[q];
        c[q] = swap ? c[q + s] : v; ci[q] = swap ? ci[q + s] : i;
        c[q + s] = swap ? v : c[q + s]; ci[q + s] = swap ? i : ci[q + s];
      }
    }
  }
#pragma unroll
  for (int q = 0; q < K; ++q) { vals[q] = c[q]; idx[q] = ci[q]; }
}
// Merge the lists of the lanes `lane ^ 1` and `lane ^ 2` (a quad) into every lane of the quad.
template <int K, bool MIN> __device__ __forceinline__ void topk_merge_quad(float* vals, int* idx) {
#pragma unroll
  for (int m = 1; m <= 2; m <<= 1) {
    float ov[K]; int oi[K];
#pragma unroll
    for (int q = 0; q < K; ++q) {
      ov[q] = __shfl_xor_sync(0xffffffffu, vals[q], m);
      oi[q] = __shfl_xor_sync(0xffffffffu, idx[q], m);
    }
    topk_merge_sorted<K, MIN>(vals, idx, ov, oi);
  }
}

// ----------------------------------------------------------------------------- atomics
__device__ __forceinline__ void red_add_global(float* p, float v) {
  asm volatile("red.global.add.f32 [%0], %1;" :: "l"(p), "f"(v) : "memory");
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// vector reductions (PTX 8.1, sm_90+): one L2 request adds 2 / 4 consecutive, 8 / 16-byte aligned floats
__device__ __forceinline__ void red_add_global_v2(float* p, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" :: "l"(p), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void red_add_global_v4(float* p, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" :: "l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
#endif
// Four 16-bit elements (f16 / bf16 storage) by one 8-byte load where they are contiguous and 8-byte aligned,
// else one by one: the test is on the addresses, so any layout reads right (scatter_add load_vec).
__device__ __forceinline__ void ld_u16x4(const unsigned short* p0, const unsigned short* p1, const unsigned short* p2,
                                         const unsigned short* p3, unsigned short& a, unsigned short& b,
                                         unsigned short& c, unsigned short& d) {
  if (p1 == p0 + 1 && p2 == p0 + 2 && p3 == p0 + 3 && (reinterpret_cast<unsigned long long>(p0) & 7ull) == 0) {
    const unsigned long long u = *reinterpret_cast<const unsigned long long*>(p0);
    a = (unsigned short)u; b = (unsigned short)(u >> 16); c = (unsigned short)(u >> 32); d = (unsigned short)(u >> 48);
  } else {
    a = *p0; b = *p1; c = *p2; d = *p3;
  }
}
__device__ __forceinline__ void red_add_global(int* p, int v) {
  asm volatile("red.global.add.s32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_add_shared(unsigned addr, float v) {
  asm volatile("red.shared.add.f32 [%0], %1;" :: "r"(addr), "f"(v) : "memory");
}
// ld(T, i, lo, hi) in an index expression: an i32 read at run time (a state-pool slot, a sequence
// offset). Values outside [lo, hi] trap: the verifier proved the accesses it feeds for that range.
__device__ __forceinline__ int ld_index(const int* p, long long i, int lo, int hi) {
  const int v = __ldg(p + i);
  if (v < lo || v > hi) __trap();
  return v;
}
// N independent f32 adds into shared memory. There is no native f32 shared atomic add (ptxas emits
// an ATOMS.CAST.SPIN loop per red.shared.add.f32, and N of them run back to back, each waiting for
// its own round trip). Here the N reads and the N compare-and-swaps are issued together, so their
// latencies overlap; only a CAS that lost a race (another warp updated the word) retries.
template <int N> __device__ __forceinline__ void red_add_shared_f32xn(const unsigned* addr, const float* v) {
  unsigned cur[N], got[N];
#pragma unroll
  for (int j = 0; j < N; ++j) asm volatile("ld.shared.b32 %0, [%1];" : "=r"(cur[j]) : "r"(addr[j]) : "memory");
#pragma unroll
  for (int j = 0; j < N; ++j)
    asm volatile("atom.shared.cas.b32 %0, [%1], %2, %3;" : "=r"(got[j])
                 : "r"(addr[j]), "r"(cur[j]), "r"(__float_as_uint(__uint_as_float(cur[j]) + v[j])) : "memory");
#pragma unroll
  for (int j = 0; j < N; ++j) {
    while (got[j] != cur[j]) {
      cur[j] = got[j];
      asm volatile("atom.shared.cas.b32 %0, [%1], %2, %3;" : "=r"(got[j])
                   : "r"(addr[j]), "r"(cur[j]), "r"(__float_as_uint(__uint_as_float(cur[j]) + v[j])) : "memory");
    }
  }
}
__device__ __forceinline__ void red_add_shared(unsigned addr, int v) {
  asm volatile("red.shared.add.s32 [%0], %1;" :: "r"(addr), "r"(v) : "memory");
}
// One arrival on a grid counter; true in the last of `count` arrivals (which resets it to 0).
__device__ __forceinline__ bool arrive_last(int* counter, int count) {
  int old;
  asm volatile("atom.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  const bool last = old == count - 1;
  if (last) *reinterpret_cast<volatile int*>(counter) = 0;
  return last;
}

// One arrival on a grid counter (after the caller's fences and barrier: the release).
__device__ __forceinline__ void arrive(int* counter) {
  asm volatile("red.global.add.s32 [%0], 1;" :: "l"(counter) : "memory");
}

// Spin until `count` CTAs have arrived on the counter; the acquire load orders the caller's later reads
// after the arrivals' writes. Backs off with nanosleep on sm_70+ (the waiters share SMs with the CTAs
// they wait for).
__device__ __forceinline__ void wait_arrivals(const int* counter, int count) {
  int seen;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    if (seen >= count) break;
#if __CUDA_ARCH__ >= 700
    __nanosleep(64);
#endif
  }
}

// One waiter done: the last of the `total` (arrivals + waiters) resets the counter to 0.
__device__ __forceinline__ void depart(int* counter, int total) {
  int old;
  asm volatile("atom.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  if (old == total - 1) *reinterpret_cast<volatile int*>(counter) = 0;
}

// ---------------------------------------------------------------- counting sort (bucket offsets, placement, run sums)
// offsets[r] = counts[0] + .. + counts[r - 1] (r < n) by the T threads of the CTA: thread t sums a run of
// buckets, a block-wide exclusive scan of the runs (warp shuffles, a word a warp in `sm`), the runs written.
template <int T, class C> __device__ void bucket_offsets(const C* counts, int* offsets, int n, int* sm) {
  static_assert(T % 32 == 0 && T <= 1024, "bucket_offsets: whole warps, at most 1024 threads");
  const int per = (n + T - 1) / T, lo = min(n, (int)threadIdx.x * per), hi = min(n, lo + per);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int mine = 0;
  for (int r = lo; r < hi; ++r) mine += (int)counts[r];
  int inc = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += v;
  }
  __syncthreads();   // sm may hold a previous call's words
  if (lane == 31) sm[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const int w = lane < T / 32 ? sm[lane] : 0;
    int x = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += v;
    }
    if (lane < T / 32) sm[lane] = x - w;
  }
  __syncthreads();
  int run = sm[warp] + inc - mine;
  for (int r = lo; r < hi; ++r) {
    const int c = (int)counts[r];
    offsets[r] = run;
    run += c;
  }
  __syncthreads();   // sm is free again
}
// Elements j = t, t + T, .. < n of keys: a non-negative key k takes slot p = cursor[kb + k]++ (atomically);
// ids[p] = ib + j, sorted[p] = kb + k.
__device__ __forceinline__ void bucket_place(const int* keys, int n, int kb, int ib, int* cursor, int* ids,
                                             int* sorted, int t, int T) {
  for (int j = t; j < n; j += T) {
    const int k = __ldg(keys + j);
    if (k < 0) continue;
    const int p = atomicAdd(cursor + kb + k, 1);
    ids[p] = ib + j;
    sorted[p] = kb + k;
  }
}
// 8 consecutive floats added into dst (16-byte aligned): two vector reds on sm_90, else eight.
__device__ __forceinline__ void run_flush8(float* dst, const float* a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  red_add_global_v4(dst, a[0], a[1], a[2], a[3]);
  red_add_global_v4(dst + 4, a[4], a[5], a[6], a[7]);
#else
#pragma unroll
  for (int e = 0; e < 8; ++e) red_add_global(dst + e, a[e]);
#endif
}
// dst[keys[p], :] += src[ids[p], :] for p0 <= p < p0 + n (keys non-decreasing), D columns (a multiple of 8):
// groups of D / 8 of the T threads (thread t: group t / (D / 8), columns 8 (t % (D / 8))), each group a
// contiguous share of the slots; a run of one key summed in registers (U rows' loads in flight) and added once.
template <int D, int U> __device__ void segment_sums(const f16* src, const int* ids, const int* keys, int p0, int n,
                                                     float* dst, int t, int T) {
  constexpr int G = D / 8;
  const int groups = T / G, g = t / G, c = 8 * (t % G);
  if (g >= groups) return;
  const int per = (n + groups - 1) / groups, lo = p0 + min(n, g * per), hi = p0 + min(n, (g + 1) * per);
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int cur = -1;
  for (int p = lo; p < hi; p += U) {
    int key[U];
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      key[u] = p + u < hi ? __ldg(keys + p + u) : -1;
      const int id = p + u < hi ? __ldg(ids + p + u) : 0;
      if (key[u] >= 0) v[u] = __ldg(reinterpret_cast<const uint4*>(src + (long long)id * D + c));
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (key[u] < 0) continue;
      if (key[u] != cur) {
        if (cur >= 0) run_flush8(dst + (long long)cur * D + c, acc);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = 0.f;
        cur = key[u];
      }
      const unsigned w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[2 * e] += h2f((f16)(w[e] & 0xffffu));
        acc[2 * e + 1] += h2f((f16)(w[e] >> 16));
      }
    }
  }
  if (cur >= 0) run_flush8(dst + (long long)cur * D + c, acc);
}

// ---------------------------------------------------------------- row_select (block-wide exact top-k)
// Order-preserving keys of scores: a smaller key is a better score (min: smaller value; max: larger).
template <bool MN> __device__ __forceinline__ unsigned sel_key(float f) {
  const unsigned u = __float_as_uint(MN ? f : -f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
template <bool MN> __device__ __forceinline__ float sel_value(unsigned key) {
  const float f = __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
  return MN ? f : -f;
}
// scratch words the row selection uses: a 4096-bin histogram, SEL_CAP 64-bit candidates, 32 warp words, 8 control
#define CAKE_SEL_CAP 4096
#define CAKE_SEL_WORDS (4096 + 2 * CAKE_SEL_CAP + 32 + 8)
struct SelRow {   // one row segment's scores: f(j) = scale * src[j] + rbias + cbias[j], index sidx[j] or col + j
  const float* src; int n; int col; const int* sidx; float scale; float rbias; const float* cbias;
  // one rounding order for every pass (the histogram's keys and the gathers' must agree bit for bit)
  __device__ __forceinline__ float combine(float s, float c) const { return __fadd_rn(__fmaf_rn(scale, s, rbias), c); }
  __device__ __forceinline__ float score(int j) const { return combine(__ldg(src + j), cbias ? __ldg(cbias + j) : 0.0f); }
  __device__ __forceinline__ unsigned index(int j) const { return sidx ? (unsigned)__ldg(sidx + j) : (unsigned)(col + j); }
  __device__ __forceinline__ bool vec4() const {   // 16-byte loads of the scores (and biases)
    return ((reinterpret_cast<u64>(src) | reinterpret_cast<u64>(cbias)) & 15ull) == 0;
  }
};
// fn(j, key, valid) for every element of the segment, in warp-uniform trips (fn may use warp collectives;
// `valid` is false past the end): 16-byte loads, eight scores per thread in flight, where the segment is
// 16-byte aligned; single loads, four per thread, for the rest.
template <int T, bool MN, class F> __device__ __forceinline__ void sel_scan(const SelRow& r, F&& fn) {
  int head = 0;
  if (r.vec4()) {
    const int n4 = r.n >> 2;
    const float4* s4 = reinterpret_cast<const float4*>(r.src);
    const float4* c4 = reinterpret_cast<const float4*>(r.cbias);
    for (int base = 0; base < n4; base += 2 * T) {
      float f[8];
      bool ok[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int j4 = base + u * T + (int)threadIdx.x;
        ok[u] = j4 < n4;
        float4 v = {0.0f, 0.0f, 0.0f, 0.0f}, c = {0.0f, 0.0f, 0.0f, 0.0f};
        if (ok[u]) {
          v = __ldg(s4 + j4);
          if (c4) c = __ldg(c4 + j4);
        }
        f[4 * u] = r.combine(v.x, c.x);
        f[4 * u + 1] = r.combine(v.y, c.y);
        f[4 * u + 2] = r.combine(v.z, c.z);
        f[4 * u + 3] = r.combine(v.w, c.w);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e)
        fn(4 * (base + (e >> 2) * T + (int)threadIdx.x) + (e & 3), sel_key<MN>(f[e]), ok[e >> 2]);
    }
    head = n4 << 2;
  }
  for (int base = head; base < r.n; base += 4 * T) {
    float f[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = base + u * T + (int)threadIdx.x;
      f[u] = j < r.n ? r.score(j) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = base + u * T + (int)threadIdx.x;
      fn(j, sel_key<MN>(f[u]), j < r.n);
    }
  }
}
// One count per lane whose `on` holds into hist[bin], aggregated per warp: the lanes with equal bins add once
// (a row's scores crowd into a few bins of the first digits, and same-address shared atomics serialise).
// Every lane of the warp calls it.
__device__ __forceinline__ void sel_count(unsigned* hist, unsigned bin, bool on) {
  const unsigned peers = __match_any_sync(0xffffffffu, on ? bin : 0xffffffffu);
  if (on && (int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
}
// Histogram of digit (key >> shift) & (nb - 1) over the keys whose top `done` bits equal `prefix`.
template <int T, bool MN> __device__ void sel_histogram(const SelRow& r, unsigned* hist, int nb, int shift, int done,
                                                        unsigned prefix) {
  for (int i = threadIdx.x; i < nb; i += T) hist[i] = 0;
  __syncthreads();
  sel_scan<T, MN>(r, [&](int, unsigned key, bool ok) {
    sel_count(hist, (key >> shift) & (nb - 1), ok && (done == 0 || (key >> (32 - done)) == prefix));
  });
  __syncthreads();
}
// Warp 0 finds the bin holding the rem-th key (1-based): ctl[0] = bin, ctl[1] = keys in earlier bins,
// ctl[2] = keys in the bin.
__device__ void sel_find_bin(const unsigned* hist, int nb, unsigned rem, unsigned* ctl) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, per = nb / 32;
    unsigned s = 0;
    for (int i = 0; i < per; ++i) s += hist[lane * per + i];
    unsigned inc = s;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned v = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += v;
    }
    const unsigned before = inc - s;
    if (before < rem && rem <= inc) {   // exactly one lane
      unsigned c = before;
      for (int i = 0; i < per; ++i) {
        const unsigned h = hist[lane * per + i];
        if (c + h >= rem) { ctl[0] = lane * per + i; ctl[1] = c; ctl[2] = h; break; }
        c += h;
      }
    }
  }
  __syncthreads();
}
// Appends (key << 32 | index) of every key <= hi (strict: < hi) to cand through the counter ctl[3].
template <int T, bool MN> __device__ void sel_gather(const SelRow& r, unsigned hi, bool strict, u64* cand, unsigned* ctl) {
  sel_scan<T, MN>(r, [&](int j, unsigned key, bool ok) {
    if (ok && (strict ? key < hi : key <= hi)) {
      const unsigned at = atomicAdd(&ctl[3], 1u);
      cand[at] = ((u64)key << 32) | r.index(j);
    }
  });
  __syncthreads();
}
// Appends the first `need` keys equal to `key0` in position order (their indices grow with position)
// after the ctl[3] candidates already there: the ties at the k-th key when they overflow the buffer.
template <int T, bool MN> __device__ void sel_gather_ties(const SelRow& r, unsigned key0, unsigned need, u64* cand,
                                                          unsigned* warps, unsigned* ctl) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int base = 0; base < r.n; base += T) {
    const int j = base + threadIdx.x;
    const bool hit = j < r.n && sel_key<MN>(r.score(j)) == key0;
    const unsigned ball = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warps[w] = __popc(ball);
    __syncthreads();
    unsigned before = 0, total = 0;
    for (int i = 0; i < T / 32; ++i) { before += i < w ? warps[i] : 0; total += warps[i]; }
    const unsigned got = ctl[4];
    const unsigned pos = got + before + __popc(ball & ((1u << lane) - 1u));
    if (hit && pos < need) cand[ctl[3] + pos] = ((u64)key0 << 32) | r.index(j);
    __syncthreads();
    if (threadIdx.x == 0) ctl[4] = got + total;
    __syncthreads();
    if (got + total >= need) break;
  }
  if (threadIdx.x == 0) ctl[3] += need;
  __syncthreads();
}
// Ascending bitonic sort of cand[0, p) (p a power of two), all T threads.
template <int T> __device__ void sel_sort(u64* cand, int p) {
  for (int size = 2; size <= p; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < p / 2; i += T) {
        const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
        const u64 a = cand[lo], b = cand[hi];
        if ((a > b) == ((lo & size) == 0)) { cand[lo] = b; cand[hi] = a; }
      }
      __syncthreads();
    }
  }
}
// Sample-first threshold for long segments: CAKE_SEL_SAMPLE keys at a fixed stride stand for the segment; two
// 12-bit histogram passes over the sample alone find the sample key whose rank scales to about `target` keys of
// the segment (to 24 bits), and one gather takes every key up to that prefix. Exact when the gather holds at
// least kk keys and fits the buffer (every key it leaves out is worse than all it holds); otherwise the caller
// runs the full radix selection. One pass over the segment instead of two or three.
#define CAKE_SEL_SAMPLE 2048
#define CAKE_SEL_SAMPLE_MIN_N (16 * CAKE_SEL_SAMPLE)
template <int T, bool MN> __device__ void sel_sample_histogram(const SelRow& r, unsigned* hist, int stride,
                                                               int shift, int done, unsigned prefix) {
  for (int i = threadIdx.x; i < 4096; i += T) hist[i] = 0;
  __syncthreads();
  for (int base = 0; base < CAKE_SEL_SAMPLE; base += T) {   // warp-uniform trips (sel_count's __match_any_sync)
    const int i = base + (int)threadIdx.x;
    const bool ok = i < CAKE_SEL_SAMPLE;
    const unsigned key = ok ? sel_key<MN>(r.score(i * stride)) : 0u;
    sel_count(hist, (key >> shift) & 4095u, ok && (done == 0 || (key >> (32 - done)) == prefix));
  }
  __syncthreads();
}
// Appends (key << 32 | index) of every key <= hi while the buffer has room; ctl[3] counts them all.
template <int T, bool MN> __device__ void sel_gather_capped(const SelRow& r, unsigned hi, u64* cand, unsigned* ctl) {
  sel_scan<T, MN>(r, [&](int j, unsigned key, bool ok) {
    if (ok && key <= hi) {
      const unsigned at = atomicAdd(&ctl[3], 1u);
      if (at < CAKE_SEL_CAP) cand[at] = ((u64)key << 32) | r.index(j);
    }
  });
  __syncthreads();
}
// True when cand[0, ctl[3]) holds every key up to a threshold and at least kk of them; false with ctl[3] = 0.
template <int T, bool MN> __device__ bool sel_by_sample(const SelRow& r, unsigned kk, u64* cand, unsigned* hist,
                                                        unsigned* ctl) {
  const int stride = r.n / CAKE_SEL_SAMPLE;
  const unsigned target = min((unsigned)CAKE_SEL_CAP / 2, max(4u * kk, kk + 512u));
  unsigned rem = (unsigned)(((unsigned long long)target * CAKE_SEL_SAMPLE + r.n - 1) / r.n);   // >= 1
  unsigned prefix = 0;
  for (int done = 0; done < 24; done += 12) {
    sel_sample_histogram<T, MN>(r, hist, stride, 20 - done, done, prefix);
    sel_find_bin(hist, 4096, rem, ctl);
    prefix = (prefix << 12) | ctl[0];
    rem -= ctl[1];
    __syncthreads();   // ctl is rewritten by the next pass
  }
  sel_gather_capped<T, MN>(r, (prefix << 8) | 0xffu, cand, ctl);
  const unsigned cnt = ctl[3];
  __syncthreads();
  const bool ok = cnt >= kk && cnt <= CAKE_SEL_CAP;
  if (!ok) {
    if (threadIdx.x == 0) ctl[3] = 0;
    __syncthreads();
  }
  return ok;
}
// The K best scores of a row segment (best first, ties to the smaller index), by all T threads of the CTA:
// on a long segment a sample-first threshold and one gather (sel_by_sample); else, or where that misses,
// radix selection of the K-th key over 12 + 12 + 8 bit digits (a histogram pass over the segment each,
// stopping once the keys up to the K-th key's bin fit the candidate buffer), a gather of those keys; then a
// bitonic sort in shared memory. Entries past the segment's length get the worst value and index -1.
template <int K, int T, bool MN>
__device__ void row_select(const SelRow& r, float* ov, int* oi, unsigned* sm) {
  unsigned* hist = sm;
  u64* cand = reinterpret_cast<u64*>(sm + 4096);
  unsigned* warps = sm + 4096 + 2 * CAKE_SEL_CAP;
  unsigned* ctl = warps + 32;
  const unsigned kk = (unsigned)min(K, r.n);
  if (threadIdx.x == 0) { ctl[3] = 0; ctl[4] = 0; }
  __syncthreads();
  unsigned prefix = 0, rem = kk, less = 0, inbin = 0;
  int done = 0;
  const bool sampled = kk > 0 && r.n >= CAKE_SEL_SAMPLE_MIN_N && sel_by_sample<T, MN>(r, kk, cand, hist, ctl);
  if (kk > 0 && !sampled) {
    for (int pass = 0; pass < 3; ++pass) {
      const int width = pass < 2 ? 12 : 8, nb = 1 << width;
      sel_histogram<T, MN>(r, hist, nb, 32 - done - width, done, prefix);
      sel_find_bin(hist, nb, rem, ctl);
      prefix = (prefix << width) | ctl[0];
      done += width;
      less += ctl[1];
      rem -= ctl[1];
      inbin = ctl[2];
      __syncthreads();   // ctl is rewritten by the next pass
      if (less + inbin <= CAKE_SEL_CAP) break;
    }
    const unsigned hi = done == 32 ? prefix : ((prefix << (32 - done)) | ((1u << (32 - done)) - 1u));
    if (less + inbin <= CAKE_SEL_CAP) {
      sel_gather<T, MN>(r, hi, false, cand, ctl);
    } else {   // every 32 bits resolved: the keys before the K-th key, then the first `rem` ties
      sel_gather<T, MN>(r, hi, true, cand, ctl);
      sel_gather_ties<T, MN>(r, hi, rem, cand, warps, ctl);
    }
  }
  const unsigned cnt = ctl[3];
  int p = 1;
  while (p < (int)cnt) p <<= 1;
  for (int i = threadIdx.x + cnt; i < p; i += T) cand[i] = ~0ull;
  __syncthreads();
  sel_sort<T>(cand, p);
  for (int i = threadIdx.x; i < K; i += T) {
    if (i < (int)kk) {
      ov[i] = sel_value<MN>((unsigned)(cand[i] >> 32));
      oi[i] = (int)(unsigned)cand[i];
    } else {
      ov[i] = MN ? 3.0e38f : -3.0e38f;
      oi[i] = -1;
    }
  }
  __syncthreads();   // the scratch is free again
}

}  // namespace cake
