"""The wide k-means' centroid sums by a counting sort (tasks/kmeans/sorted_sums.py; the IR ops bucket_offsets,
bucket_place, segment_sums). CPU: the three kernels and the assignment forms that leave the sums to them verify
and compile for sm_80 / sm_90a without spills; E-SORT-01 refuses misuse; the variant's domain; the library's
loop launches the six kernels in order with the shapes they declare; cake::bucket_place and
cake::segment_sums, compiled for the host from the header and run thread by thread, give numpy's per-cluster
sums. GPU (marked): cakelib.kmeans with `sums: "sorted"` against a float64 Lloyd step."""
import re
import shutil
import subprocess

import numpy as np
import pytest

from cake_ir.compiler import compile_ir
from cake_ir.lower.emit import header_text
from cake_ir.verifier import verify
from cakelib.variants import kmeans_name, kmeans_wide_kernels, kmeans_wide_params, kmeans_wide_supports
from tasks.kmeans import sorted_sums as ss
from tasks.kmeans.wide import kmeans_wide_assign_wgmma
from tasks.kmeans.wide_tma import kmeans_wide_assign_tma
from test_kmeans_wide import _FakeBuf, _FakeRuntime, _gpu, check_one_step

CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
TMA = {"kind": "wide", "mma": "wgmma", "points": "tma", "bm": 128, "bn": 256, "dc": 64, "stages": 4, "red": 4,
       "copies": 1, "sums": "sorted"}


def _errors(k):
    return [d.short() for d in verify(k).diagnostics if d.severity == "error"]


def _compiles(k, arch):
    r = compile_ir(k, arch=arch)
    assert r.ok, [d.short() for d in r.diagnostics if d.severity == "error"]
    notes = [d.message for d in r.diagnostics if d.code == "N-BACKEND-RESOURCES"]
    assert notes and "0 B spill stores" in notes[0], notes


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("D", [32, 96, 768, 1024])
def test_sort_kernels_verify_and_compile(D, arch):
    for k in (ss.kmeans_sums_offsets(arch), ss.kmeans_sums_place(arch), ss.kmeans_sums_runs(D, arch)):
        assert not _errors(k), (k.name, _errors(k))
        _compiles(k, arch)


def _ops(k):
    from cake_ir.walk import statements
    return [s.node.id for s in statements(k) if getattr(s.node, "op", "") == "scatter_add"]


@pytest.mark.parametrize("D,form", [(256, "resident"), (512, "resident"), (768, "tma"), (1024, "tma")])
def test_sorted_assignment_forms_count_only(D, form):
    """With sorted_sums the assignment adds the counts and no sums (no `sum_points` scatter), and compiles."""
    def build(s):
        if form == "tma":
            return kmeans_wide_assign_tma(D, sorted_sums=s)
        return kmeans_wide_assign_wgmma(D, bm=128, bn=128, stages=4, red=4, sorted_sums=s)
    k, k0 = build(True), build(False)
    assert _ops(k) == ["count_points"] and "sum_points" in _ops(k0)
    assert k.name.endswith("_ss") and k.name != k0.name
    assert not _errors(k), _errors(k)
    _compiles(k, "sm_90a")
    with pytest.raises(ValueError, match="one copy"):
        kmeans_wide_assign_tma(D, sorted_sums=True, copies=2)
    with pytest.raises(ValueError, match="pt 1"):
        kmeans_wide_assign_tma(D, sorted_sums=True, pt=2)


def test_variant_domain_and_name():
    shape = {"B": 1, "N": 1 << 20, "K": 1024, "D": 1024, "arch": "sm_90a"}
    assert kmeans_wide_supports(TMA, shape)
    assert kmeans_name(TMA).endswith("_ss") and not kmeans_name({**TMA, "sums": "reds"}).endswith("_ss")
    resident = {**kmeans_wide_params({**shape, "D": 256}, pingpong=False), "copies": 1, "sums": "sorted"}
    assert kmeans_wide_supports(resident, {**shape, "D": 256})
    for bad in ({**TMA, "copies": 2}, {**TMA, "pt": 2}, {**TMA, "sums": "maybe"}, {**TMA, "mma": "sync"},
                {**TMA, "points": "pingpong"}):
        assert not kmeans_wide_supports(bad, shape), bad
    assert list(kmeans_wide_kernels(TMA, 1024, "sm_90a")) == ["norms", "assign", "offsets", "place", "runs",
                                                              "finalize"]


def test_offsets_by_part_of_the_cta_and_read_only_cursor_are_refused():
    from cake_ir.builder import KernelBuilder, tile
    kb = KernelBuilder("offsets_half", arch="sm_80", grid=[1], threads=256)
    kb.scalar("R", min=1)
    kb.tensor("WC", "f32", ["R", 1])
    kb.tensor("CUR", "i32", [1, "R"])      # read-only: the op writes it
    kb.buffer("w", "smem", "i32", [16])    # fewer words than 32
    with kb.role("main", warps=(0, 4)) as r:
        r.add("bucket_offsets", counts=tile("WC", [0, 0]), dst=tile("CUR", [0, 0]), count="R", scratch=tile("w"))
    with kb.role("idle", warps=(4, 4)) as r:
        r.sync("syncthreads")
    got = [d for d in verify(kb.build()).diagnostics if d.code == "E-SORT-01"]
    nodes = {d.node for d in got}
    assert "/roles/0/body/0" in nodes and "/roles/0/body/0/dst/buf" in nodes and "/roles/0/body/0/scratch/buf" in nodes


def _host_source() -> str:
    h = header_text()
    place = re.search(r"__device__ __forceinline__ void bucket_place\(.*?\n}\n", h, re.S)
    runs = re.search(r"template <int D, int U> __device__ void segment_sums\(.*?\n}\n", h, re.S)
    assert place and runs, "bucket_place / segment_sums not found in cake.cuh"
    return place.group(0) + runs.group(0)


DRIVER = r"""#include <cstdio>
#include <cstring>
#include <cmath>
#include <algorithm>
#include <vector>
#define __device__
#define __forceinline__ inline
using std::min;
struct uint4 { unsigned x, y, z, w; };
namespace cake {
typedef unsigned short f16;
template <class P> P __ldg(const P* p) { return *p; }
int atomicAdd(int* p, int v) { int o = *p; *p += v; return o; }
float h2f(f16 h) {   // IEEE half -> float
  const unsigned s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0 ? std::ldexp((float)m, -24) : std::ldexp((float)(m | 1024), (int)e - 25);
  return s ? -v : v;
}
void run_flush8(float* dst, const float* a) { for (int e = 0; e < 8; ++e) dst[e] += a[e]; }
%SOURCE%
}
// stdin: B N K D T PE RS, then B*N keys, then B*N*D halves; stdout: the B*K x D sums
int main() {
  int B, N, K, D, T, PE, RS;
  if (scanf("%d %d %d %d %d %d %d", &B, &N, &K, &D, &T, &PE, &RS) != 7) return 1;
  std::vector<int> keys(B * N), cnt(B * K, 0), cur(B * K), ids(B * N, -1), sk(B * N, -1);
  std::vector<unsigned short> x((size_t)B * N * D);
  for (auto& k : keys) if (scanf("%d", &k) != 1) return 1;
  for (auto& h : x) { unsigned v; if (scanf("%u", &v) != 1) return 1; h = (unsigned short)v; }
  for (int b = 0; b < B; ++b) for (int n = 0; n < N; ++n) if (keys[b * N + n] >= 0) cnt[b * K + keys[b * N + n]]++;
  for (int r = 0, s = 0; r < B * K; ++r) { cur[r] = s; s += cnt[r]; }
  for (int b = 0; b < B; ++b)                      // the place kernel's CTAs, each thread in turn
    for (int n0 = 0; n0 < N; n0 += PE)
      for (int t = 0; t < T; ++t)
        cake::bucket_place(&keys[b * N + n0], min(PE, N - n0), b * K, b * N + n0, cur.data(), ids.data(), sk.data(), t, T);
  int placed = 0;
  for (int p = 0; p < B * N; ++p) placed += ids[p] >= 0;
  std::vector<float> ws((size_t)B * K * D, 0.f);
  for (int p0 = 0; p0 < placed; p0 += RS)          // the runs kernel's CTAs over the placed slots
    for (int t = 0; t < T; ++t) {
      if (D == 32) cake::segment_sums<32, 3>(x.data(), ids.data(), sk.data(), p0, min(RS, placed - p0), ws.data(), t, T);
      else cake::segment_sums<96, 4>(x.data(), ids.data(), sk.data(), p0, min(RS, placed - p0), ws.data(), t, T);
    }
  printf("%d\n", placed);
  for (float v : ws) printf("%.9g\n", v);
}
"""


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
@pytest.mark.parametrize("B,N,K,D,T,PE,RS", [(2, 1000, 37, 96, 64, 300, 250), (1, 777, 5, 32, 32, 100, 64),
                                              (3, 64, 200, 32, 128, 64, 2048)])
def test_place_and_run_sums_give_the_cluster_sums(tmp_path, B, N, K, D, T, PE, RS):
    """Keys (some negative: skipped) placed by bucket_place from exclusive offsets, then summed run by run by
    segment_sums over CTAs of RS slots (runs crossing CTAs and thread groups): numpy's per-cluster sums."""
    src, exe = tmp_path / "sort.cpp", tmp_path / "sort"
    src.write_text(DRIVER.replace("%SOURCE%", _host_source()))
    subprocess.run([CXX, "-O1", "-std=c++14", str(src), "-o", str(exe)], check=True, capture_output=True, timeout=120)
    rng = np.random.default_rng(B * N + K)
    keys = rng.integers(0, K, size=(B, N)) if K > 5 else rng.choice([0, 0, 0, 3, 4], size=(B, N))
    keys[rng.random((B, N)) < 0.05] = -1
    x = rng.standard_normal((B, N, D)).astype(np.float16)
    inp = f"{B} {N} {K} {D} {T} {PE} {RS}\n" + " ".join(map(str, keys.ravel())) + "\n" \
        + " ".join(map(str, x.view(np.uint16).ravel()))
    out = subprocess.run([str(exe)], input=inp, capture_output=True, text=True, check=True, timeout=60).stdout.split()
    assert int(out[0]) == int((keys >= 0).sum())
    got = np.array(out[1:], dtype=np.float64).reshape(B * K, D)
    want = np.zeros((B * K, D))
    for b in range(B):
        ok = keys[b] >= 0
        np.add.at(want, b * K + keys[b][ok], x[b][ok].astype(np.float64))
    assert np.abs(got - want).max() < 1e-3 * max(1.0, np.abs(want).max()), np.abs(got - want).max()


def test_wide_loop_runs_the_sort_between_assignment_and_finalize(monkeypatch):
    """The library's loop with `sums: "sorted"` on a recording runtime: norms, assign, offsets, place, runs,
    finalize per iteration, each launch's buffers of the shapes its kernel declares, the sort's buffers shared."""
    from cakelib import arrays, kmeans_lloyd
    monkeypatch.setattr(arrays, "empty_like_kind", lambda like, shape, dtype, scratch=False: _FakeBuf(shape))
    monkeypatch.setattr(arrays, "stream_of", lambda arg: 0)
    rt = _FakeRuntime()
    B, N, K, D = 2, 3000, 100, 768
    kmeans_lloyd._wide_loop(rt, TMA, _FakeBuf((B, N, D)), _FakeBuf((B, K, D)), _FakeBuf((B, N)),
                            _FakeBuf((B * K, D)), B, N, K, D, 2)
    launches = rt.launches
    names = [n.split("_d")[0] if n.startswith("kmeans_wide_d") else n for n, _ in launches]
    assert names[:6] == [f"kmeans_wide_norms_d{D}", "kmeans_wide", "kmeans_sums_offsets", "kmeans_sums_place",
                         f"kmeans_sums_runs_d{D}", f"kmeans_wide_finalize_d{D}"] and len(names) == 12
    by = {n: p for n, p in launches[:6]}
    place, runs = by["kmeans_sums_place"], by[f"kmeans_sums_runs_d{D}"]
    assert place["IDS"] == runs["IDS"] and place["SK"] == runs["SK"] and place["CUR"] == by["kmeans_sums_offsets"]["CUR"]


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("form", ["tma", "resident"])
@pytest.mark.parametrize("B,N,D,K", [(1, 4099, 768, 1030), (1, 2000, 1024, 129), (2, 3001, 256, 300),
                                     (3, 999, 64, 77), (1, 20011, 1024, 7)])
def test_sorted_sums_kmeans_matches_float64(B, N, D, K, form):
    import torch
    from cakelib import kmeans
    if form == "tma" and D < 768:
        pytest.skip("the TMA form is the rule's from D = 768")
    shape = {"B": B, "N": N, "K": K, "D": D, "arch": "sm_90a"}
    if form == "tma":
        variant = TMA
    else:   # the rule's resident form, or from D = 768 (where the rule streams the points) one of 64 points
        base = kmeans_wide_params(shape, pingpong=False, sorted_sums=False)
        if base.get("points") == "tma":
            base = {"kind": "wide", "mma": "wgmma", "dc": 64, "red": 4, "bm": 64, "bn": 128, "stages": 4}
        variant = {**{n: v for n, v in base.items() if n != "sb"}, "copies": 1, "sums": "sorted"}
    g = torch.Generator().manual_seed(B * N + D + K)
    x = (torch.randn(B, N, D, generator=g) + 3 * torch.randn(B, 1, D, generator=g)).half().cuda()
    c0 = x[:, torch.randperm(N, generator=g)[:K].cuda()].clone()
    xs, cs = x.float().cpu().numpy(), c0.float().cpu().numpy()
    Cn, A = kmeans(x, K, 1, init=c0, variant=variant)
    for b in range(B):
        err = check_one_step(xs[b], cs[b], A[b].cpu().numpy(), Cn[b].cpu().numpy())
        assert not err, f"batch {b}: {err}"
    C3, A3 = kmeans(x, K, 3, init=c0, variant=variant)
    C2, _ = kmeans(x, K, 2, init=c0, variant=variant)
    c2 = C2.half().float().cpu().numpy()
    for b in range(B):
        err = check_one_step(xs[b], c2[b], A3[b].cpu().numpy(), C3[b].cpu().numpy())
        assert not err, f"3 iterations, batch {b}: {err}"
