// CPU emulation of cake::row_select (cake_ir/runtime/cake.cuh): T std::threads stand for the CTA's threads,
// std::barrier for __syncthreads and the warp primitives, so that the selection's logic (histogram passes,
// bin search, gathers, tie path, bitonic sort) is checked against a sort without a GPU.
// Reads cases from stdin: kind(0 min / 1 max) K n use_idx scale rbias use_cbias, then n scores (and n
// indices, n col biases); prints the K (value, index) pairs.
#include <atomic>
#include <barrier>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>
#include <algorithm>
#include <cmath>

#define __device__
#define __forceinline__ inline
struct Dim { int x; };
thread_local Dim threadIdx;
static std::barrier<>* g_block;
static std::vector<std::barrier<>*> g_warp;
static unsigned g_xchg[64][32];
static void __syncthreads() { g_block->arrive_and_wait(); }
static unsigned __shfl_up_sync(unsigned, unsigned v, int o) {
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_xchg[w][l] = v; g_warp[w]->arrive_and_wait();
  const unsigned r = l >= o ? g_xchg[w][l - o] : v; g_warp[w]->arrive_and_wait();
  return r;
}
static unsigned __ballot_sync(unsigned, bool p) {
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_xchg[w][l] = p; g_warp[w]->arrive_and_wait();
  unsigned m = 0; for (int i = 0; i < 32; ++i) m |= (g_xchg[w][i] ? 1u : 0u) << i;
  g_warp[w]->arrive_and_wait();
  return m;
}
static unsigned __match_any_sync(unsigned, unsigned v) {
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  g_xchg[w][l] = v; g_warp[w]->arrive_and_wait();
  unsigned m = 0; for (int i = 0; i < 32; ++i) m |= (g_xchg[w][i] == v ? 1u : 0u) << i;
  g_warp[w]->arrive_and_wait();
  return m;
}
struct float4 { float x, y, z, w; };
static float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static float __fadd_rn(float a, float b) { return a + b; }
static int __ffs(unsigned x) { return __builtin_ffs((int)x); }
static unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
static int __popc(unsigned x) { return __builtin_popcount(x); }
static unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
template <class X> static X __ldg(const X* p) { return *p; }
using std::min;
using std::max;
namespace cake {
typedef unsigned long long u64;

#include "row_select_body.inc"
}

template <int K, int T, bool MN> void run(const cake::SelRow& r, float* ov, int* oi) {
  std::vector<unsigned> sm(CAKE_SEL_WORDS + 2);
  std::barrier<> block(T);
  g_block = &block;
  std::vector<std::barrier<>*> warps;
  for (int w = 0; w < T / 32; ++w) warps.push_back(new std::barrier<>(32));
  g_warp = warps;
  std::vector<std::thread> th;
  for (int t = 0; t < T; ++t) th.emplace_back([&, t] { threadIdx.x = t; cake::row_select<K, T, MN>(r, ov, oi, sm.data()); });
  for (auto& x : th) x.join();
  for (auto* b : warps) delete b;
}

template <int K> void dispatch(bool mx, const cake::SelRow& r, float* ov, int* oi) {
  if (mx) run<K, 64, false>(r, ov, oi); else run<K, 64, true>(r, ov, oi);
}

int main() {
  int kind, K, n, use_idx, use_cb, shift; float scale, rbias;
  while (scanf("%d %d %d %d %f %f %d %d", &kind, &K, &n, &use_idx, &scale, &rbias, &use_cb, &shift) == 8) {
    // shift 1: the scores and biases one float past a 16-byte boundary (the single-load path)
    std::vector<float> sb(n + 4), cbb(n + 4); std::vector<int> idx(n);
    float* s = sb.data() + shift; float* cb = cbb.data() + shift;
    for (int i = 0; i < n; ++i) scanf("%f", &s[i]);
    if (use_idx) for (auto& x : idx) scanf("%d", &x);
    if (use_cb) for (int i = 0; i < n; ++i) scanf("%f", &cb[i]);
    cake::SelRow r{s, n, 7, use_idx ? idx.data() : nullptr, scale, rbias, use_cb ? cb : nullptr};
    std::vector<float> ov(K); std::vector<int> oi(K);
    switch (K) {
      case 1: dispatch<1>(kind, r, ov.data(), oi.data()); break;
      case 33: dispatch<33>(kind, r, ov.data(), oi.data()); break;
      case 100: dispatch<100>(kind, r, ov.data(), oi.data()); break;
      case 1024: dispatch<1024>(kind, r, ov.data(), oi.data()); break;
      default: printf("bad K\n"); return 1;
    }
    for (int i = 0; i < K; ++i) printf("%.9g %d\n", ov[i], oi[i]);
    fflush(stdout);
  }
}
