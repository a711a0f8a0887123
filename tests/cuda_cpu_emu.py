"""Run a lowered CAKE kernel on the CPU: its CUDA C++ compiled by g++ against a small shim (a
std::thread per CUDA thread, std::barrier for __syncthreads and the warp shuffles, exact-math stand-ins
for the runtime's fast forms). For kernels of plain loads / stores, register math, warp shuffles,
shared memory and __syncthreads only (no cp.async, mbarriers, tensor cores, inline PTX): a check of
the emitted index arithmetic and synchronisation on a machine without a GPU, at toy sizes.

    outs = emulate(kernel, scalars, arrays, grid, workdir)   # -> {name: array} of the written tensors
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np

SHIM = r'''// CPU emulation of one CAKE kernel: a std::thread per CUDA thread, barriers for __syncthreads / shuffles.
#include <barrier>
#include <thread>
#include <vector>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
struct dim3e { unsigned x, y, z; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
thread_local dim3e threadIdx, blockIdx;
thread_local unsigned char* g_smem;
thread_local std::barrier<>* g_cta_bar;
thread_local std::barrier<>* g_warp_bar;
thread_local float* g_xch;   // this warp's 32 exchange slots
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(a, b)
static inline void __syncthreads() { g_cta_bar->arrive_and_wait(); }
static inline float xch_read(float v, int src) {
  int lane = threadIdx.x & 31;
  g_xch[lane] = v; g_warp_bar->arrive_and_wait();
  float r = g_xch[src & 31]; g_warp_bar->arrive_and_wait();
  return r;
}
static inline float __shfl_xor_sync(unsigned, float v, int m) { return xch_read(v, (threadIdx.x & 31) ^ m); }
static inline float __shfl_sync(unsigned, float v, int s) { return xch_read(v, s); }
static inline int __shfl_sync(unsigned, int v, int s) { (void)s; return v; }   // only cake_warp (warp-uniform)
static inline unsigned __shfl_sync(unsigned, unsigned v, int s) { (void)s; return v; }
namespace cake {
typedef unsigned short bf16;
static inline float u2f(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned f2u(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float inf() { return INFINITY; }
static inline float bf2f(bf16 x) { return u2f(((unsigned)x) << 16); }
static inline bf16 f2bf(float x) { unsigned u = f2u(x); u += 0x7fff + ((u >> 16) & 1); return (bf16)(u >> 16); }
static inline float sq(float x) { return x * x; }
static inline float fexp(float x) { return std::exp(x); }
static inline float frcp(float x) { return 1.0f / x; }
static inline float frsqrt(float x) { return 1.0f / std::sqrt(x); }
static inline float sigmoidf(float x) { return frcp(1.0f + fexp(-x)); }
static inline float flg2(float x) { return std::log2(x); }
static inline float softplusf(float x) {
  float u = fexp(-fabsf(x));
  float small = u * (1.0f - u * (0.5f - u * 0.33333333f));
  float l = u < 0.03125f ? small : 0.69314718f * flg2(1.0f + u);
  return fmaxf(x, 0.0f) + l;
}
static inline unsigned smem_u32(const void*) { return 0; }
static inline int ld_index(const int* p, long long i, int lo, int hi) {
  int v = p[i]; if (v < lo || v > hi) { fprintf(stderr, "trap: idx %d\n", v); abort(); } return v;
}
constexpr int ilog2(int x) { return x <= 1 ? 0 : 1 + ilog2(x / 2); }
static inline float warp_sum(float v) { for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o); return v; }
template <int R, int H> struct SumRowsLevel {
  static void run(float (&v)[R], int lane) {
    constexpr int O = 32 * H / R;
    const bool up = (lane & O) != 0;
    for (int i = 0; i < H; ++i) {
      const float send = up ? v[i] : v[i + H];
      const float keep = up ? v[i + H] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
    SumRowsLevel<R, H / 2>::run(v, lane);
  }
};
template <int R> struct SumRowsLevel<R, 0> { static void run(float (&)[R], int) {} };
template <int R> inline void warp_sum_rows(float (&v)[R]) {
  const int lane = threadIdx.x & 31;
  SumRowsLevel<R, R / 2>::run(v, lane);
  for (int o = 16 / R; o > 0; o >>= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
  const float t = v[0];
  for (int r = 0; r < R; ++r) v[r] = __shfl_sync(0xffffffffu, t, r << (5 - ilog2(R)));
}
}  // namespace cake
'''


def available() -> bool:
    return shutil.which("g++") is not None


def kernel_source(kernel) -> tuple[str, list[str]]:
    """The kernel function of the lowered source as `void kern(..)`, and its parameter declarations."""
    from cake_ir.compiler import compile_kernel
    src = compile_kernel(kernel, arch="sm_90a").cuda_source
    body = src[src.index('extern "C" __global__'):]
    body = re.sub(r'extern "C" __global__ void __launch_bounds__\([^)]*\) (\w+)\(', "void kern(", body, count=1)
    body = body.replace("extern __shared__ __align__(1024) unsigned char cake_smem[];", "unsigned char* cake_smem = g_smem;")
    sig = body[body.index("void kern(") + len("void kern("): body.index(") {")]
    params = [ln.split("//")[0].strip().rstrip(",") for ln in sig.split("\n")]
    return body, [p for p in params if p]


def _main(body: str, params: list[str], scalars: dict, arrays: dict, grid, threads: int, d: str) -> str:
    """main(): load every tensor from d/<name>.bin, run the CTAs one after another, save the writable ones."""
    call, loads, saves = [], [], []
    for p in params:
        name = p.split()[-1]
        if "*" not in p:
            call.append(str(int(scalars[name])))
            continue
        ty = p.split("*")[0].replace("const", "").strip()
        loads.append(f'  auto* {name}_p = reinterpret_cast<{ty}*>(load("{d}/{name}.bin"));')
        call.append(f"{name}_p")
        if not p.startswith("const"):
            saves.append(f'  save("{d}/{name}.out", {name}_p, {arrays[name].nbytes}L);')
    gx, gy, gz = (list(grid) + [1, 1])[:3]
    return f"""#include "shim.h"
{body}
static unsigned char* load(const char* f) {{
  FILE* fp = fopen(f, "rb"); fseek(fp, 0, SEEK_END); long n = ftell(fp); fseek(fp, 0, SEEK_SET);
  unsigned char* p = (unsigned char*)aligned_alloc(64, (n + 63) / 64 * 64);
  if (fread(p, 1, n, fp) != (size_t)n) abort();
  fclose(fp); return p;
}}
static void save(const char* f, void* p, long n) {{ FILE* fp = fopen(f, "wb"); fwrite(p, 1, n, fp); fclose(fp); }}
int main() {{
{chr(10).join(loads)}
  const unsigned nt = {threads};
  for (unsigned z = 0; z < {gz}u; ++z) for (unsigned y = 0; y < {gy}u; ++y) for (unsigned x = 0; x < {gx}u; ++x) {{
    std::vector<unsigned char> smem(1 << 17, 0xcd);      // poisoned: a read before any write shows
    std::barrier<> cta(nt);
    std::vector<std::barrier<>*> wb;
    for (unsigned w = 0; w < nt / 32; ++w) wb.push_back(new std::barrier<>(32));
    std::vector<float> xch(nt);
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < nt; ++t) ts.emplace_back([&, t] {{
      threadIdx = {{t, 0, 0}}; blockIdx = {{x, y, z}}; g_smem = smem.data(); g_cta_bar = &cta;
      g_warp_bar = wb[t / 32]; g_xch = xch.data() + (t / 32) * 32;
      kern({", ".join(call)});
    }});
    for (auto& th : ts) th.join();
    for (auto* b : wb) delete b;
  }}
{chr(10).join(saves)}
  return 0;
}}
"""


def emulate(kernel, scalars: dict, arrays: dict, grid, workdir: str) -> dict:
    """Run `kernel` over `grid` (x, y, z CTAs) with the given scalars and tensors (numpy arrays in the
    kernel's storage dtypes: bf16 as uint16); -> the tensors it may write, as the kernel left them."""
    body, params = kernel_source(kernel)
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "shim.h"), "w") as f:
        f.write(SHIM)
    for p in params:
        if "*" in p:
            np.ascontiguousarray(arrays[p.split()[-1]]).tofile(os.path.join(workdir, p.split()[-1] + ".bin"))
    with open(os.path.join(workdir, "main.cpp"), "w") as f:
        f.write(_main(body, params, scalars, arrays, grid, kernel.launch.threads, workdir))
    exe = os.path.join(workdir, "emu")
    subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-w", "-o", exe, os.path.join(workdir, "main.cpp")],
                   check=True, capture_output=True)
    subprocess.run([exe], check=True, capture_output=True, timeout=300)
    names = [p.split()[-1] for p in params if "*" in p and not p.startswith("const")]
    return {n: np.fromfile(os.path.join(workdir, n + ".out"), dtype=arrays[n].dtype).reshape(arrays[n].shape)
            for n in names}
