"""cake::topk_insert, the runtime's sorted insertion, compiled for the host with the system C++ compiler
and fed random streams with ties: after every stream each list must equal the best k (value, index)
pairs of the stream, best first, for k = 1..32 and both directions, inserted on the spot and through
the deferred insertion's queue (topk_push / topk_flush). The GPU tests check it inside the kernels; this
checks the insertion itself without a GPU (skipped when there is no C++ compiler)."""
import random
import re
import shutil
import subprocess

import pytest

from cake_ir.lower.emit import header_text

CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
KS = (1, 2, 3, 8, 10, 16, 32)


def _selection_source() -> str:
    """topk_better and topk_insert as the header has them, with the CUDA qualifiers defined away."""
    h = header_text()
    m = re.search(r"template <bool MIN> __device__ __forceinline__ bool topk_better.*?\n}\n"
                  r"template <int K, bool MIN> __device__ __forceinline__ void topk_insert.*?\n}\n", h, re.S)
    q = re.search(r"template <int T> __device__ __forceinline__ void topk_push.*?\n}\n.*?"
                  r"template <int K, int T, bool MIN> __device__ __forceinline__ void topk_flush.*?\n}\n", h, re.S)
    assert m and q, "topk_better / topk_insert / topk_push / topk_flush not found in cake.cuh"
    return m.group(0) + q.group(0)


def _driver() -> str:
    calls = "\n".join(f"    case {k}: run<{k}>(mn, n, queued); break;" for k in KS)
    return f"""#include <cstdio>
#include <cmath>
#define __device__
#define __forceinline__ inline
namespace cake {{
{_selection_source()}
}}
template <int K, bool MIN> void flush(float* v, int* ix, float* qv, int* qi) {{ cake::topk_flush<K, 4, MIN>(v, ix, qv, qi); }}
// queued: the lowering's deferred insertion with T = 4 (push unless the queue is full, else insert on
// the spot; every 8 entries ("a tile") flush when half full; a final flush, the merge's)
template <int K> void run(int mn, int n, int queued) {{
  float v[K]; int ix[K]; float qv[4]; int qi[4] = {{-1, -1, -1, -1}};
  for (int q = 0; q < K; ++q) {{ v[q] = mn ? INFINITY : -INFINITY; ix[q] = 2147483647; }}
  for (int t = 0; t < n; ++t) {{
    float x; int i;
    if (scanf("%f %d", &x, &i) != 2) return;
    if (queued && qi[3] < 0) cake::topk_push<4>(qv, qi, x, i);
    else if (mn) cake::topk_insert<K, true>(v, ix, x, i); else cake::topk_insert<K, false>(v, ix, x, i);
    if (queued && t % 8 == 7 && qi[1] >= 0) {{ if (mn) flush<K, true>(v, ix, qv, qi); else flush<K, false>(v, ix, qv, qi); }}
  }}
  if (queued) {{ if (mn) flush<K, true>(v, ix, qv, qi); else flush<K, false>(v, ix, qv, qi); }}
  for (int q = 0; q < K; ++q) printf("%.9g %d\\n", v[q], ix[q]);
}}
int main() {{
  int k, mn, n, queued;
  while (scanf("%d %d %d %d", &k, &mn, &n, &queued) == 4) {{
    switch (k) {{
{calls}
    }}
    printf("end\\n");
  }}
}}
"""


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
def test_topk_insert_keeps_the_best_k_sorted(tmp_path):
    src, exe = tmp_path / "topk.cpp", tmp_path / "topk"
    src.write_text(_driver())
    subprocess.run([CXX, "-O1", "-std=c++14", str(src), "-o", str(exe)], check=True, capture_output=True, timeout=120)
    rng = random.Random(5)
    cases, lines = [], []
    for k, mn, n, queued in ((k, mn, n, queued) for k in KS for mn in (1, 0) for n in (k - 1, k, 3 * k + 7, 400)
                             for queued in (0, 1)):
        n = max(n, 0)
        # few distinct values: many exact ties, broken by the index; indices in random order
        vals = [float(rng.randint(-20, 20)) / 4 for _ in range(n)]
        idx = rng.sample(range(10 * n + 10), n)
        cases.append((k, mn, list(zip(vals, idx))))
        lines.append(f"{k} {mn} {n} {queued}")
        lines += [f"{x!r} {i}" for x, i in zip(vals, idx)]
    out = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True,
                         timeout=60).stdout.split("end\n")
    assert len(out) == len(cases) + 1
    for (k, mn, stream), got in zip(cases, out):
        key = (lambda p: (p[0], p[1])) if mn else (lambda p: (-p[0], p[1]))
        want = sorted(stream, key=key)[:k]
        rows = [ln.split() for ln in got.strip().splitlines()]
        assert len(rows) == k
        got_pairs = [(float(a), int(b)) for a, b in rows]
        fill = (float("inf") if mn else float("-inf"), 2147483647)
        assert got_pairs == want + [fill] * (k - len(want)), (k, mn, len(stream))


def _merge_source() -> str:
    """topk_better, inf and the bitonic merge (topk_pow2, topk_merge_sorted) as the header has them."""
    h = header_text()
    b = re.search(r"template <bool MIN> __device__ __forceinline__ bool topk_better.*?\n}\n", h, re.S)
    m = re.search(r"template <int K> struct topk_pow2.*?"
                  r"template <int K, bool MIN> __device__ __forceinline__ void topk_merge_sorted.*?\n}\n", h, re.S)
    assert b and m, "topk_better / topk_merge_sorted not found in cake.cuh"
    return "inline float inf() { return INFINITY; }\n" + b.group(0) + m.group(0)


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
def test_topk_merge_sorted_keeps_the_best_k_of_two_lists(tmp_path):
    """Two sorted lists (the best k of two random streams with ties, short streams leaving the worst fill
    (inf / -inf, INT_MAX) in their tails, as an unfilled list holds) merged by the bitonic network: the
    best k of their union, best first, for k = 1..32 (powers of two and not) and both directions."""
    calls = "\n".join(f"    case {k}: run<{k}>(mn); break;" for k in KS)
    src, exe = tmp_path / "merge.cpp", tmp_path / "merge"
    src.write_text(f"""#include <cstdio>
#include <cmath>
#define __device__
#define __forceinline__ inline
namespace cake {{
{_merge_source()}
}}
template <int K> void run(int mn) {{
  float a[K], b[K]; int ai[K], bi[K];
  for (int q = 0; q < K; ++q) if (scanf("%f %d", &a[q], &ai[q]) != 2) return;
  for (int q = 0; q < K; ++q) if (scanf("%f %d", &b[q], &bi[q]) != 2) return;
  if (mn) cake::topk_merge_sorted<K, true>(a, ai, b, bi); else cake::topk_merge_sorted<K, false>(a, ai, b, bi);
  for (int q = 0; q < K; ++q) printf("%.9g %d\\n", a[q], ai[q]);
  printf("end\\n");
}}
int main() {{
  int k, mn;
  while (scanf("%d %d", &k, &mn) == 2) {{
    switch (k) {{
{calls}
    }}
  }}
}}
""")
    subprocess.run([CXX, "-O1", "-std=c++14", str(src), "-o", str(exe)], check=True, capture_output=True, timeout=120)
    rng = random.Random(11)
    cases, lines = [], []
    for k in KS:
        for mn in (1, 0):
            fill = (float("inf") if mn else float("-inf"), 2147483647)
            key = (lambda p: (p[0], p[1])) if mn else (lambda p: (-p[0], p[1]))
            for na, nb in ((k, k), (3 * k, 2 * k + 1), (k // 2, 3 * k), (0, k), (1, 0), (5 * k, 5 * k)):
                idx = rng.sample(range(20 * (na + nb) + 10), na + nb)   # disjoint candidates, as the merges see
                vals = [float(rng.randint(-12, 12)) / 4 for _ in range(na + nb)]
                sa, sb = list(zip(vals[:na], idx[:na])), list(zip(vals[na:], idx[na:]))
                la = (sorted(sa, key=key)[:k] + [fill] * k)[:k]
                lb = (sorted(sb, key=key)[:k] + [fill] * k)[:k]
                cases.append((k, (sorted(sa + sb, key=key)[:k] + [fill] * k)[:k]))
                lines.append(f"{k} {mn}")
                lines += [f"{x!r} {i}" for x, i in la + lb]
    out = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True,
                         timeout=60).stdout.split("end\n")
    assert len(out) == len(cases) + 1
    for (k, want), got in zip(cases, out):
        pairs = [(float(a), int(b)) for a, b in (ln.split() for ln in got.strip().splitlines())]
        assert pairs == want, (k, pairs, want)
