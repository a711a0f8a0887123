"""An mma accumulator reused as the next mma's A operand in registers (`map` into an mma_a fragment from
mma_acc tiles of the same shape): O = bf16(s * X W1^T) W2^T, the pattern of P V after Q K^T and of
A_qk V_new in chunked linear attention. Verified and compiled everywhere; checked on a GPU (marked)."""
import numpy as np
import pytest

from cake_ir.builder import KernelBuilder, tile
from cake_ir.compiler import compile_kernel
from cake_ir.verifier import verify


def _stage(r, copies):
    """cp.async each (global tensor, smem buffer, shape) tile, wait for all, make them CTA-visible."""
    for src, dst, shape in copies:
        r.copy("cp_async", tile(src, [0] * len(shape), shape), tile(dst), vec_bytes=16)
    r.sync("cp_async_commit")
    r.sync("cp_async_wait", n=0)
    r.sync("syncthreads")


def _bf16(rng, *shapes):
    """Normal values that bf16 holds exactly, one float32 array per shape."""
    from gpu_backend.memory import round_to_bf16
    return [round_to_bf16(rng.standard_normal(s).astype(np.float32)) for s in shapes]


def _run_on_gpu(make, inputs, outputs, scalars=None):
    """Build make(arch) for this GPU and launch it once. inputs {name: (host array, dtype)}, outputs
    {name: (initial host array: NaN where the kernel must write, dtype)} -> {output name: host array after
    the launch}."""
    from gpu_backend.driver import arch_of, context, gpu_available, properties
    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    from contextlib import ExitStack

    from gpu_backend.memory import DeviceArray, synchronize
    from gpu_backend.runner import CompiledKernel
    context(0)
    arch = arch_of(properties(0))
    k = make(arch)
    ck = CompiledKernel(k, compile_kernel(k, arch=arch))
    with ExitStack() as stack:
        dev = {n: stack.enter_context(DeviceArray.from_host(a, dt)) for n, (a, dt) in {**inputs, **outputs}.items()}
        ck(dev, scalars or {})
        synchronize()
        return {n: dev[n].download() for n in outputs}


def chain(arch="sm_80", src_layout="mma_acc"):
    kb = KernelBuilder("mma_chain", arch=arch, grid=[1], threads=32)
    kb.tensor("X", "bf16", [16, 32])
    kb.tensor("W1", "bf16", [32, 32])
    kb.tensor("W2", "bf16", [16, 32])
    kb.tensor("O", "f32", [16, 16], access="write")
    for n, shape in (("sX", [16, 32]), ("sW1", [32, 32]), ("sW2", [16, 32])):
        kb.buffer(n, "smem", "bf16", shape)
    kb.buffer("fx", "reg", "bf16", [16, 32], layout="mma_a", scope="warp")
    kb.buffer("fw1", "reg", "bf16", [32, 32], layout="mma_b", scope="warp")
    kb.buffer("fw2", "reg", "bf16", [16, 32], layout="mma_b", scope="warp")
    if src_layout == "mma_acc":
        kb.buffer("P", "reg", "f32", [16, 32], layout="mma_acc", scope="warp")
    else:
        kb.buffer("P", "reg", "f32", [16, 32], layout="blocked", vec=4, scope="warp")
    kb.buffer("Pa", "reg", "bf16", [16, 32], layout="mma_a", scope="warp")
    kb.buffer("acc", "reg", "f32", [16, 16], layout="mma_acc", scope="warp")
    with kb.role("main", warps=(0, 1)) as r:
        _stage(r, (("X", "sX", [16, 32]), ("W1", "sW1", [32, 32]), ("W2", "sW2", [16, 32])))
        r.ldmatrix(tile("sX"), tile("fx"))
        r.ldmatrix(tile("sW1"), tile("fw1"))
        r.ldmatrix(tile("sW2"), tile("fw2"))
        r.fill("P", 0.0)
        r.fill("acc", 0.0)
        if src_layout == "mma_acc":
            r.mma_sync(tile("fx"), tile("fw1"), tile("P"))
        r.map("Pa", "P * 0.5", id="acc_to_operand")
        r.mma_sync(tile("Pa"), tile("fw2"), tile("acc"))
        r.stg(tile("acc"), tile("O", [0, 0], [16, 16]), vec_bytes=4)
    return kb.build()


def test_chain_verifies_and_compiles():
    k = chain()
    assert verify(k).ok, [d.short() for d in verify(k).diagnostics]
    for arch in ("sm_80", "sm_90a"):
        r = compile_kernel(k, arch=arch)
        assert r.ok, [d.short() for d in r.diagnostics]
        assert "cake::pack_bf16x2(cake_lo, cake_hi)" in r.cuda_source


def test_map_into_an_operand_names_the_wrong_source():
    r = compile_kernel(chain(src_layout="blocked"), arch="sm_80")
    assert not r.ok
    msg = " ".join(d.message for d in r.diagnostics)
    assert "reads mma_acc tiles of its shape" in msg and "'P' is a blocked" in msg


@pytest.mark.gpu
def test_chain_on_gpu():
    X, W1, W2 = _bf16(np.random.default_rng(0), (16, 32), (32, 32), (16, 32))
    got = _run_on_gpu(lambda arch: chain(arch=arch), {"X": (X, "bf16"), "W1": (W1, "bf16"), "W2": (W2, "bf16")},
                      {"O": (np.full((16, 16), np.nan, np.float32), "f32")})["O"]
    from gpu_backend.memory import round_to_bf16
    P = round_to_bf16((X.astype(np.float64) @ W1.T.astype(np.float64) * 0.5).astype(np.float32))
    ref = P.astype(np.float64) @ W2.T.astype(np.float64)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < 1e-2, err          # a misplaced pair would be O(1)


def trans_b(n=16, arch="sm_80"):
    """C = A Bk with Bk stored [K, N] (row-major, as a product's right factor is): ldmatrix.trans."""
    kb = KernelBuilder(f"mma_trans_b_{n}", arch=arch, grid=[1], threads=32)
    kb.tensor("A", "bf16", [16, 32])
    kb.tensor("Bk", "bf16", [32, n])
    kb.tensor("C", "f32", [16, n], access="write")
    kb.buffer("sA", "smem", "bf16", [16, 32])
    kb.buffer("sB", "smem", "bf16", [32, n])
    kb.buffer("fa", "reg", "bf16", [16, 32], layout="mma_a", scope="warp")
    kb.buffer("fb", "reg", "bf16", [n, 32], layout="mma_b", scope="warp")
    kb.buffer("acc", "reg", "f32", [16, n], layout="mma_acc", scope="warp")
    with kb.role("main", warps=(0, 1)) as r:
        _stage(r, (("A", "sA", [16, 32]), ("Bk", "sB", [32, n])))
        r.ldmatrix(tile("sA"), tile("fa"))
        r.ldmatrix(tile("sB"), tile("fb"), trans=True, id="load_b_trans")
        r.fill("acc", 0.0)
        r.mma_sync(tile("fa"), tile("fb"), tile("acc"))
        r.stg(tile("acc"), tile("C", [0, 0], [16, n]), vec_bytes=4)
    return kb.build()


@pytest.mark.parametrize("n", [16, 8])
def test_trans_b_verifies_and_compiles(n):
    k = trans_b(n)
    assert verify(k).ok, [d.short() for d in verify(k).diagnostics]
    r = compile_kernel(k, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics]
    assert ("ldmatrix_x4_trans" if n == 16 else "ldmatrix_x2_trans") in r.cuda_source


def trans_a(arch="sm_80"):
    """C = Ak^T B with Ak stored [K, M] (tokens x channels, as K^T V_new reads K): ldmatrix.trans into
    an mma_a fragment."""
    kb = KernelBuilder("mma_trans_a", arch=arch, grid=[1], threads=32)
    kb.tensor("Ak", "bf16", [32, 16])
    kb.tensor("B", "bf16", [16, 32])
    kb.tensor("C", "f32", [16, 16], access="write")
    kb.buffer("sA", "smem", "bf16", [32, 16])
    kb.buffer("sB", "smem", "bf16", [16, 32])
    kb.buffer("fa", "reg", "bf16", [16, 32], layout="mma_a", scope="warp")
    kb.buffer("fb", "reg", "bf16", [16, 32], layout="mma_b", scope="warp")
    kb.buffer("acc", "reg", "f32", [16, 16], layout="mma_acc", scope="warp")
    with kb.role("main", warps=(0, 1)) as r:
        _stage(r, (("Ak", "sA", [32, 16]), ("B", "sB", [16, 32])))
        r.ldmatrix(tile("sA"), tile("fa"), trans=True, id="load_a_trans")
        r.ldmatrix(tile("sB"), tile("fb"))
        r.fill("acc", 0.0)
        r.mma_sync(tile("fa"), tile("fb"), tile("acc"))
        r.stg(tile("acc"), tile("C", [0, 0], [16, 16]), vec_bytes=4)
    return kb.build()


def test_trans_a_compiles_and_checks_the_transposed_shape():
    import json

    from cake_ir.io import load
    k = trans_a()
    assert verify(k).ok, [d.short() for d in verify(k).diagnostics]
    r = compile_kernel(k, arch="sm_90a")
    assert r.ok and "const int cake_lr = (cake_lane >> 4) * 8 + (cake_lane & 7)" in r.cuda_source
    doc = json.loads(k.model_dump_json(by_alias=True, exclude_none=True))
    for st in doc["roles"][0]["body"]:
        if st.get("id") == "load_a_trans":
            del st["trans"]                     # the [32, 16] tile no longer matches the [16, 32] fragment
    k2, diags = load(doc)
    assert k2 is not None, diags
    assert [d for d in verify(k2).diagnostics if d.code == "E-CPY-05" and "shapes differ" in d.message]


@pytest.mark.gpu
def test_trans_a_on_gpu():
    Ak, B = _bf16(np.random.default_rng(4), (32, 16), (16, 32))
    got = _run_on_gpu(lambda arch: trans_a(arch=arch), {"Ak": (Ak, "bf16"), "B": (B, "bf16")},
                      {"C": (np.full((16, 16), np.nan, np.float32), "f32")})["C"]
    ref = Ak.T.astype(np.float64) @ B.T.astype(np.float64)
    assert np.abs(got - ref).max() < 1e-3 * np.abs(ref).max()


@pytest.mark.gpu
@pytest.mark.parametrize("n", [16, 8])
def test_trans_b_on_gpu(n):
    A, Bk = _bf16(np.random.default_rng(1), (16, 32), (32, n))
    got = _run_on_gpu(lambda arch: trans_b(n, arch=arch), {"A": (A, "bf16"), "Bk": (Bk, "bf16")},
                      {"C": (np.full((16, n), np.nan, np.float32), "f32")})["C"]
    ref = A.astype(np.float64) @ Bk.astype(np.float64)
    assert np.abs(got - ref).max() < 1e-3 * np.abs(ref).max(), np.abs(got - ref).max()


def _xy_buffers(kb):
    """X, Y [16, 32] bf16 inputs, their smem copies, fragments and a [16, 16] accumulator."""
    kb.tensor("X", "bf16", [16, 32])
    kb.tensor("Y", "bf16", [16, 32])
    kb.buffer("sX", "smem", "bf16", [16, 32])
    kb.buffer("sY", "smem", "bf16", [16, 32])
    kb.buffer("fx", "reg", "bf16", [16, 32], layout="mma_a", scope="warp")
    kb.buffer("fy", "reg", "bf16", [16, 32], layout="mma_b", scope="warp")
    kb.buffer("acc", "reg", "f32", [16, 16], layout="mma_acc", scope="warp")


def _xy_product(r, extra=()):
    """acc = X Y^T (staging X, Y and the `extra` copies first)."""
    _stage(r, (("X", "sX", [16, 32]), ("Y", "sY", [16, 32])) + tuple(extra))
    r.ldmatrix(tile("sX"), tile("fx"))
    r.ldmatrix(tile("sY"), tile("fy"))
    r.fill("acc", 0.0)
    r.mma_sync(tile("fx"), tile("fy"), tile("acc"))


def masked_gram(arch="sm_80", strict=True):
    """A = tril(X Y^T) (strict: c < r, else c <= r) on the accumulator with row() / col(): the causal
    masks of chunked linear attention (A_kk strictly lower, A_qk lower with its diagonal)."""
    kb = KernelBuilder("masked_gram", arch=arch, grid=[1], threads=32)
    _xy_buffers(kb)
    kb.tensor("A", "f32", [16, 16], access="write")
    with kb.role("main", warps=(0, 1)) as r:
        _xy_product(r)
        r.map("acc", f"select(col() {'<' if strict else '<='} row(), acc, 0)", id="causal_mask")
        r.stg(tile("acc"), tile("A", [0, 0], [16, 16]), vec_bytes=4)
    return kb.build()


def test_masked_gram_compiles_with_element_coordinates():
    k = masked_gram()
    assert verify(k).ok, [d.short() for d in verify(k).diagnostics]
    r = compile_kernel(k, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics]
    src = r.cuda_source
    assert "const int cake_row = ((cake_e >> 2) / 2) * 16 + (cake_lane >> 2) + ((cake_e & 3) >> 1) * 8;" in src
    assert "((float)cake_col < (float)cake_row)" in src


@pytest.mark.parametrize("cols", [64, 128, 256])
def test_coordinates_on_a_blocked_tile(cols):
    """row() / col() of a blocked [8, cols] vec-4 warp tile: element e of lane l is flat index
    ((e / 4) * 32 + l) * 4 + e % 4. The emitted coordinate lines are evaluated here for every (lane, e)
    against that index; when a row spans whole 128-element chunks (cols 128, 256) row() must not depend
    on the lane (so per-row selects fold at compile time)."""
    import re
    kb = KernelBuilder("coords", arch="sm_80", grid=[1], threads=32)
    kb.tensor("O", "f32", [8, cols], access="write")
    kb.buffer("t", "reg", "f32", [8, cols], layout="blocked", vec=4, scope="warp")
    with kb.role("main", warps=(0, 1)) as r:
        r.map("t", "row() * 1000 + col()")
        r.stg(tile("t"), tile("O", [0, 0], [8, cols]), vec_bytes=16)
    r2 = compile_kernel(kb.build(), arch="sm_80")
    assert r2.ok, [d.short() for d in r2.diagnostics]
    lines = r2.cuda_source.splitlines()
    at = next(i for i, ln in enumerate(lines) if "cake_row =" in ln)
    decls = [ln.strip() for ln in lines[at - 1:at + 1] if "cake_f = ((cake_e" in ln or "cake_row =" in ln]
    code = "\n".join(re.sub(r"^const int ", "", d).rstrip(";").replace(", cake_col", "\ncake_col").replace("/", "//")
                     for d in decls)
    for lane in range(32):
        for e in range(8 * cols // 32):
            env = {"cake_e": e, "cake_lane": lane}
            exec(code, {}, env)
            flat = ((e // 4) * 32 + lane) * 4 + e % 4
            assert (env["cake_row"], env["cake_col"]) == divmod(flat, cols)
    row_expr = decls[-1].split(", cake_col")[0]
    if cols % 128 == 0:
        assert "cake_lane" not in row_expr and "cake_f" not in row_expr
    else:
        assert row_expr.endswith(f"cake_f / {cols}")


@pytest.mark.gpu
@pytest.mark.parametrize("strict", [True, False])
def test_masked_gram_on_gpu(strict):
    X, Y = _bf16(np.random.default_rng(2), (16, 32), (16, 32))
    got = _run_on_gpu(lambda arch: masked_gram(arch=arch, strict=strict), {"X": (X, "bf16"), "Y": (Y, "bf16")},
                      {"A": (np.full((16, 16), np.nan, np.float32), "f32")})["A"]
    ref = np.tril(X.astype(np.float64) @ Y.T.astype(np.float64), -1 if strict else 0)
    assert np.abs(got - ref).max() < 1e-3 * np.abs(ref).max()
    assert (got[np.triu_indices(16, 0 if strict else 1)] == 0).all()   # masked entries exactly 0


def row_scaled(arch="sm_80", from_smem=False):
    """A = Diag(beta) X Y^T: beta [16] loaded into an mma_rows [16, 1] tile (the rows each lane holds),
    broadcast over the accumulator's columns in a map (beta rows of A_kk, the decay rows of the state)."""
    kb = KernelBuilder("row_scaled", arch=arch, grid=[1], threads=32)
    _xy_buffers(kb)
    kb.tensor("beta", "f32", [16])
    kb.tensor("A", "f32", [16, 16], access="write")
    kb.buffer("sb", "smem", "f32", [16])
    kb.buffer("br", "reg", "f32", [16, 1], layout="mma_rows", scope="warp")
    with kb.role("main", warps=(0, 1)) as r:
        _xy_product(r, (("beta", "sb", [16]),))
        if from_smem:
            r.lds(tile("sb", [0], [16]), tile("br"), vec_bytes=4)
        else:
            r.ldg(tile("beta", [0], [16]), tile("br"), vec_bytes=4)
        r.map("acc", "acc * br", id="row_scale")
        r.stg(tile("acc"), tile("A", [0, 0], [16, 16]), vec_bytes=4)
    return kb.build()


@pytest.mark.parametrize("from_smem", [False, True])
def test_row_scale_compiles(from_smem):
    k = row_scaled(from_smem=from_smem)
    assert verify(k).ok, [d.short() for d in verify(k).diagnostics]
    r = compile_kernel(k, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics]
    assert "acc[cake_e] * br[((((cake_e >> 2) / 2) << 1) + ((cake_e & 3) >> 1))]" in r.cuda_source


@pytest.mark.gpu
@pytest.mark.parametrize("from_smem", [False, True])
def test_row_scale_on_gpu(from_smem):
    rng = np.random.default_rng(3)
    X, Y = _bf16(rng, (16, 32), (16, 32))
    beta = rng.uniform(0.1, 2.0, 16).astype(np.float32)
    got = _run_on_gpu(lambda arch: row_scaled(arch=arch, from_smem=from_smem),
                      {"X": (X, "bf16"), "Y": (Y, "bf16"), "beta": (beta, "f32")},
                      {"A": (np.full((16, 16), np.nan, np.float32), "f32")})["A"]
    ref = beta[:, None].astype(np.float64) * (X.astype(np.float64) @ Y.T.astype(np.float64))
    assert np.abs(got - ref).max() < 1e-3 * np.abs(ref).max()


def rows_of_tokens(arch="sm_80"):
    """An accumulator [16 tokens, 16] stored into o [T, HV, 16] at (t0, hv): the rows fold into the
    token dim of a [16, 1, 16] tile, and `row_limit` stops at the sequence end (packed batches)."""
    kb = KernelBuilder("rows_of_tokens", arch=arch, grid=[1], threads=32)
    kb.scalar("T", min=1)
    kb.scalar("L", min=0)
    _xy_buffers(kb)
    kb.tensor("O", "f32", ["T", 2, 16], access="write")
    with kb.role("main", warps=(0, 1)) as r:
        _xy_product(r)
        r.add("stg", src=tile("acc"), dst=tile("O", [3, 1, 0], [16, 1, 16]), vec_bytes=4, oob="mask",
              row_limit="L", id="store_rows")
    return kb.build()


def test_row_limited_store_folds_rows_into_the_token_dim():
    k = rows_of_tokens()
    assert verify(k).ok, [d.short() for d in verify(k).diagnostics]
    r = compile_kernel(k, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics]
    src = r.cuda_source
    assert "< (int)(L)" in src and "(long long)(2) * (long long)(16)" in src


@pytest.mark.gpu
def test_row_limited_store_on_gpu():
    X, Y = _bf16(np.random.default_rng(5), (16, 32), (16, 32))
    T, L = 40, 11                                     # rows 3.. 10 written (L = 11), the rest untouched
    got = _run_on_gpu(lambda arch: rows_of_tokens(arch=arch), {"X": (X, "bf16"), "Y": (Y, "bf16")},
                      {"O": (np.full((T, 2, 16), -7.0, np.float32), "f32")}, {"T": T, "L": L})["O"]
    ref = X.astype(np.float64) @ Y.T.astype(np.float64)
    assert np.abs(got[3:L, 1] - ref[:L - 3]).max() < 1e-3 * np.abs(ref).max()
    untouched = np.ones((T, 2), bool)
    untouched[3:L, 1] = False
    assert (got[untouched] == -7.0).all()


def acc_roundtrip(arch="sm_80"):
    """ldg into an mma_acc tile, stg it back transposed: Out = In^T (h0 / ht in [V, K] order for a state
    kept as S [K, V])."""
    kb = KernelBuilder("acc_roundtrip", arch=arch, grid=[1], threads=32)
    kb.tensor("In", "f32", [16, 32])
    kb.tensor("Out", "f32", [32, 16], access="write")
    kb.buffer("acc", "reg", "f32", [16, 32], layout="mma_acc", scope="warp")
    with kb.role("main", warps=(0, 1)) as r:
        r.ldg(tile("In", [0, 0], [16, 32]), tile("acc"), vec_bytes=4)
        r.map("acc", "acc * 2")
        r.stg(tile("acc"), tile("Out", [0, 0], [32, 16]), trans=True, vec_bytes=4)
    return kb.build()


def test_acc_load_and_transposed_store_compile():
    k = acc_roundtrip()
    assert verify(k).ok, [d.short() for d in verify(k).diagnostics]
    r = compile_kernel(k, arch="sm_90a")
    assert r.ok, [d.short() for d in r.diagnostics]
    assert "Out[(0 + cake_col) * (long long)(16) + (0 + cake_row)] = (acc[cake_e]);" in r.cuda_source


@pytest.mark.gpu
def test_acc_roundtrip_on_gpu():
    x = np.random.default_rng(6).standard_normal((16, 32)).astype(np.float32)
    got = _run_on_gpu(lambda arch: acc_roundtrip(arch=arch), {"In": (x, "f32")},
                      {"Out": (np.full((32, 16), np.nan, np.float32), "f32")})["Out"]
    assert np.array_equal(got, 2 * x.T)
