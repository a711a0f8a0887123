"""cakelib.kda_decode's pool modes (in place, into `out`, copying) and the decode program's in-place
and shared-memory-staged forms: they verify and compile (sm_80, sm_90a) on the CPU, the mode logic
refuses aliasing pools, and on a GPU (marked) every mode and plan matches the float64 recurrence with
a pool of more slots than sequences, rows outside idx untouched."""
import numpy as np
import pytest

from cake_ir.compiler import compile_kernel
from cake_ir.verifier import verify

VARIANTS = [dict(vw=8, vsplit=4), dict(vw=4, vsplit=8), dict(vw=8, vsplit=4, stage_kv=True),
            dict(vw=4, vsplit=8, stage_kv=True), dict(vw=8, vsplit=2, stage_kv=True)]
# kda_decode_kv (lanes along V, the [K, V] layout only): the plan's two points and the bench's others
KV_VARIANTS = [dict(vec=2, warps=8, blocks=2), dict(vec=1, warps=8, blocks=4), dict(vec=4, warps=8, blocks=2),
               dict(vec=2, warps=8, blocks=3), dict(vec=2, warps=16, blocks=2)]



def _sources_without_spills(k):
    """The kernel verifies; its CUDA source per arch (sm_80, sm_90a), each compiled without spills."""
    assert verify(k).ok, [d.short() for d in verify(k).diagnostics if d.severity == "error"]
    for arch in ("sm_80", "sm_90a"):
        r = compile_kernel(k, arch=arch)
        assert r.ok, [d.short() for d in r.diagnostics]
        assert r.resources.get("spill_store_bytes", 1) == 0
        yield r.cuda_source


def kernel_body(src: str) -> str:
    """The kernel's own code, without the device runtime's helpers that precede it (cake.cuh)."""
    return src[src.index('extern "C" __global__'):]

def _ids(p) -> str:
    return "_".join(f"{k}{int(v)}" for k, v in p.items())


@pytest.mark.parametrize("params", VARIANTS, ids=_ids)
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "copy"])
def test_decode_forms_verify_and_compile(params, inplace):
    from tasks.kda_decode.programs import kda_decode
    for src in _sources_without_spills(kda_decode(**params, inplace=inplace, pool="P")):
        assert "cake::ld_index(idx, b, 0, P - 1)" in src           # a slot of the P-row pool, trapped
        if inplace:     # one read-write pool: no second pointer that could alias it
            assert "    float* __restrict__ state," in src and "state_out" not in src
        else:
            assert "const float* __restrict__ state," in src and "float* __restrict__ state_out" in src


@pytest.mark.parametrize("params", KV_VARIANTS, ids=_ids)
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "copy"])
def test_kv_cols_forms_verify_and_compile(params, inplace):
    from gpu_backend.runner import spec_from_kernel
    from tasks.kda_decode.programs import kda_decode_kv
    k = kda_decode_kv(**params, inplace=inplace, pool="P")
    for src in _sources_without_spills(k):
        assert "cake::ld_index(idx, b, 0, P - 1)" in src
        assert f"__launch_bounds__({32 * params['warps']}, {params['blocks']})" in src
        assert kernel_body(src).count("__syncthreads()") == 1   # one exchange of the warps' partial sums
        assert ("state_out" in src) != inplace
    vk = spec_from_kernel(k, compile_kernel(k, arch="sm_90a")).scalars["VK"]
    assert vk.violation(0) is None and vk.violation(1) is not None     # the [K, V] layout only


def test_kv_cols_lanes_read_contiguous_row_segments():
    """Lane l's columns are c0 = z * VC + l * vec of every row its warp owns: a warp instruction reads
    one 32 * vec * 4-byte run of a row (8-byte vectors at vec 2)."""
    from tasks.kda_decode.programs import kda_decode_kv
    src = compile_kernel(kda_decode_kv(vec=2, warps=8, inplace=True), arch="sm_90a").cuda_source
    assert "const int cl = cake_lane * VEC;" in src and "const int c0 = blockIdx.x * VC + cl;" in src
    assert "const int b = blockIdx.z;" in src         # a state's V-slices are neighbours in launch order
    assert "const int k0 = cake_role_warp * KW;" in src
    assert "cake_v = *reinterpret_cast<const uint2*>((state + (" in src
    one = compile_kernel(kda_decode_kv(vec=4, warps=8, inplace=True), arch="sm_90a").cuda_source
    assert "blockIdx.z" not in one and "const int b = blockIdx.y;" in one    # one V-slice of 128 columns


@pytest.mark.parametrize("params,inplace,safe", [(dict(vec=2, warps=8, blocks=2), True, 1),
                                                 (dict(vec=1, warps=8, blocks=4), False, 0),
                                                 (dict(vec=4, warps=8, blocks=2), True, 0)],
                         ids=["c2w8_inplace_safe", "c1w8_copy_softplus", "c4w8_inplace_softplus"])
def test_kv_cols_emulated_on_cpu_matches_float64(params, inplace, safe, tmp_path):
    """The lowered kda_decode_kv run on the CPU (tests/cuda_cpu_emu.py: a thread per CUDA thread):
    o and the rows idx of the pool against the float64 step, the other rows as they were; grouped
    heads (H = 2, HV = 4), a pool of 7 slots for 3 sequences."""
    import cuda_cpu_emu as emu
    if not emu.available():
        pytest.skip("needs g++")
    from tasks.kda import reference as R
    from tasks.kda_decode.programs import kda_decode_kv
    B, P, HV = 3, 7, 4
    shape, x = _inputs(B=B, P=P, HV=HV, safe=safe, vk=0, seed=5)
    o_ref, pool_ref = R.kda_decode(x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], x["state"],
                                   x["idx"], safe=bool(safe), layout="kv")
    arr = {n: _bf16_bits(x[n]) for n in ("q", "k", "v", "g", "beta")}
    arr.update(A_log=np.asarray(x["A_log"], np.float32), dt_bias=np.asarray(x["dt_bias"], np.float32),
               state=np.asarray(x["state"], np.float32), idx=np.asarray(x["idx"], np.int32),
               o=np.full((B, HV, 128), 0x7fc0, np.uint16))                       # NaN until written
    if not inplace:
        arr["state_out"] = np.full_like(arr["state"], 7.0)
    vsplit = 128 // (32 * params["vec"])
    grid = (vsplit, HV, B) if vsplit > 1 else (HV, B, 1)
    out = emu.emulate(kda_decode_kv(**params, inplace=inplace, pool="P"),
                      {"B": B, "P": P, "H": shape["H"], "HV": HV, "SAFE": safe, "VK": 0}, arr, grid, str(tmp_path))
    pool = out["state" if inplace else "state_out"]
    o = (out["o"].astype(np.uint32) << 16).view(np.float32)
    rest = np.setdiff1d(np.arange(P), x["idx"])
    assert _rel_np(o, o_ref) <= 5e-3 and _rel_np(pool[x["idx"]], pool_ref[x["idx"]]) <= 5e-3
    assert np.array_equal(pool[rest], arr["state"][rest] if inplace else np.full_like(pool[rest], 7.0))


def _bf16_bits(a) -> np.ndarray:
    """float -> bf16 storage bits, round to nearest even (what the kernels read)."""
    u = np.asarray(a, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _rel_np(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def test_kv_cols_refuses_bad_shapes():
    from tasks.kda_decode.programs import kda_decode_kv
    with pytest.raises(AssertionError):
        kda_decode_kv(vec=3)
    with pytest.raises(AssertionError):
        kda_decode_kv(vec=2, warps=6)


def test_staged_kv_loads_whole_rows_and_pads_the_smem_rows():
    from tasks.kda_decode.programs import kda_decode
    src = compile_kernel(kda_decode(vw=8, vsplit=4, inplace=True, stage_kv=True), arch="sm_90a").cuda_source
    assert kernel_body(src).count("__syncthreads()") == 2   # slab in, slab out
    assert "* 144 +" in src                              # rows of 32 floats + 4 pad: distinct banks per lane
    plain = compile_kernel(kda_decode(vw=8, vsplit=4, inplace=True), arch="sm_90a").cuda_source
    assert "__syncthreads()" not in kernel_body(plain)


def test_unstaged_task_seed_is_unchanged():
    # the task's interface (pool of B slots, read-only state, separate state_out)
    from tasks.kda_decode.programs import SEEDS
    src = compile_kernel(SEEDS["kda_decode_sm80"](), arch="sm_90a").cuda_source
    assert "cake::ld_index(idx, b, 0, B - 1)" in src and "float* __restrict__ state_out" in src


def test_decode_plan():
    from cakelib.kda_attention import _decode_program, decode_plan
    assert decode_plan(256, 32, "vk") == {"vw": 16, "vsplit": 2, "stage_kv": False}
    assert decode_plan(128, 32, "vk")["vw"] == 16 and decode_plan(64, 32, "vk") == {"vw": 8, "vsplit": 4,
                                                                                  "stage_kv": False}
    assert decode_plan(256, 32, "kv") == {"form": "cols", "vec": 4, "warps": 8, "blocks": 2}
    assert decode_plan(64, 32, "kv") == {"form": "cols", "vec": 2, "warps": 8, "blocks": 2}
    assert decode_plan(5, 32, "kv")["vec"] == 2 and decode_plan(4, 32, "kv") == {"form": "cols", "vec": 1,
                                                                                "warps": 8, "blocks": 4}
    assert decode_plan(1, 32, "vk")["vw"] == 4 and decode_plan(4, 32, "vk")["vw"] == 4
    assert decode_plan(5, 32, "vk")["vw"] == 8
    assert _decode_program(decode_plan(64, 32, "kv"), "sm_90a", True).name == "kda_decode_kv_c2_w8_b2_inplace"
    assert _decode_program(decode_plan(64, 32, "vk"), "sm_90a", False).name == "kda_decode_8_4_pool"
    with pytest.raises(ValueError, match="state_layout"):
        decode_plan(1, 32, "kk")


def test_pool_modes_and_aliasing_refusals():
    torch = pytest.importorskip("torch")
    from cakelib.kda_attention import _decode_pools
    pool = torch.zeros(6, 2, 128, 128)
    src, dst = _decode_pools(pool, True, None)
    assert src is pool and dst is pool                       # in place: the pool itself
    src, dst = _decode_pools(pool, False, pool)
    assert src is pool and dst is pool                       # out=state_pool means in place
    src, dst = _decode_pools(pool, False, None)
    assert dst is not pool and dst.data_ptr() != pool.data_ptr() and torch.equal(dst, pool)
    out = torch.empty_like(pool)
    assert _decode_pools(pool, False, out)[1] is out
    with pytest.raises(ValueError, match="overlaps"):
        _decode_pools(pool[:3], False, pool[1:4])
    with pytest.raises(ValueError, match="shape"):
        _decode_pools(pool, False, torch.empty(5, 2, 128, 128))
    with pytest.raises(ValueError, match="no `out`"):
        _decode_pools(pool, True, out)
    with pytest.raises(ValueError, match="contiguous"):
        _decode_pools(pool.transpose(2, 3), True, None)


def test_cpu_tensors_are_refused():
    torch = pytest.importorskip("torch")
    from cakelib import kda_decode
    B, H, bf = 2, 2, torch.bfloat16
    z = torch.zeros
    with pytest.raises(TypeError, match="CUDA torch tensor"):
        kda_decode(z(B, H, 128, dtype=bf), z(B, H, 128, dtype=bf), z(B, H, 128, dtype=bf), z(B, H, 128, dtype=bf),
                   z(B, H, dtype=bf), z(H), z(H, 128), z(4, H, 128, 128), torch.tensor([3, 0], dtype=torch.int32),
                   inplace=True)


def _inputs(B: int, P: int, HV: int, safe: int, vk: int, seed: int):
    """Task inputs for B sequences with a pool of P > B slots: idx picks B distinct slots."""
    from tasks.kda.task import DECODE_TASK, state_values
    shape = {"B": B, "H": 2, "HV": HV, "SAFE": safe, "VK": vk}
    x = DECODE_TASK.make_inputs(shape, seed=seed)
    rng = np.random.default_rng(seed)
    x["state"] = state_values((P,) + x["state"].shape[1:], rng)
    x["idx"] = rng.choice(P, B, replace=False).astype(np.int32)
    return shape, x


def _gpu():
    from gpu_backend.driver import gpu_available
    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    return pytest.importorskip("torch")


def _torch_inputs(torch, x: dict) -> dict:
    bf = ("q", "k", "v", "g", "beta")
    return {n: torch.as_tensor(np.asarray(a)).to("cuda", torch.bfloat16 if n in bf else
                                               torch.int32 if n == "idx" else torch.float32)
            for n, a in x.items()}


def _rel(a, b) -> float:
    a = a.double().cpu().numpy()
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.gpu
@pytest.mark.parametrize("params", [None] + VARIANTS + [dict(form="cols", **p) for p in KV_VARIANTS],
                         ids=lambda p: "plan" if p is None else _ids({k: v for k, v in p.items() if k != "form"}))
@pytest.mark.parametrize("vk,safe", [(1, 1), (0, 0), (0, 1), (1, 0)])
def test_inplace_matches_float64_and_keeps_other_rows(params, vk, safe):
    torch = _gpu()
    if params and params.get("form") == "cols" and vk:
        return _cols_refused_for_vk(torch, params, safe)
    from cakelib import kda_decode
    from tasks.kda import reference as R
    shape, x = _inputs(B=5, P=13, HV=4, safe=safe, vk=vk, seed=7 + vk + 2 * safe)
    o_ref, pool_ref = R.kda_decode(x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], x["state"],
                                   x["idx"], safe=bool(safe), layout="vk" if vk else "kv")
    t = _torch_inputs(torch, x)
    pool = t["state"]
    before = pool.clone()
    snap = before.clone()
    args = [t[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias")]
    o, out = kda_decode(*args, pool, t["idx"], safe_gate=bool(safe), state_layout="vk" if vk else "kv",
                        inplace=True, plan=params)
    torch.cuda.synchronize()
    assert out is pool
    assert _rel(o, o_ref) <= 5e-3 and _rel(pool[t["idx"].long()], pool_ref[x["idx"]]) <= 5e-3
    rest = torch.ones(pool.shape[0], dtype=torch.bool, device="cuda")
    rest[t["idx"].long()] = False
    assert torch.equal(pool[rest], before[rest])              # rows not in idx: bit for bit
    # the copying mode and out= from the same inputs: the input pool untouched
    o2, copy = kda_decode(*args, before, t["idx"], safe_gate=bool(safe), state_layout="vk" if vk else "kv",
                          plan=params)
    dst = torch.full_like(before, 7.0)
    o3, into = kda_decode(*args, before, t["idx"], safe_gate=bool(safe), state_layout="vk" if vk else "kv",
                          out=dst, plan=params)
    torch.cuda.synchronize()
    assert into is dst and copy is not before
    assert _rel(copy, pool_ref) <= 5e-3 and _rel(o2, o_ref) <= 5e-3 and _rel(o3, o_ref) <= 5e-3
    assert torch.equal(copy[rest], before[rest]) and torch.equal(before, snap)   # the input pool untouched
    assert _rel(into[t["idx"].long()], pool_ref[x["idx"]]) <= 5e-3 and bool((into[rest] == 7.0).all())


def _cols_refused_for_vk(torch, params: dict, safe: int):
    """A "cols" plan (the [K, V] layout's program) with state_layout "vk": refused before any launch."""
    from cakelib import kda_decode
    shape, x = _inputs(B=2, P=3, HV=2, safe=safe, vk=1, seed=1)
    t = _torch_inputs(torch, x)
    args = [t[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias")]
    with pytest.raises(ValueError, match="'kv' only"):
        kda_decode(*args, t["state"], t["idx"], safe_gate=bool(safe), state_layout="vk", inplace=True, plan=params)
