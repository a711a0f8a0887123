"""The symbolic bound prover (cake_ir.analysis.bounds) used by E-CPY-03 / E-CPY-06."""
from cake_ir.analysis.bounds import Prover
from cake_ir.io import load
from cake_ir.verifier import Context


def _kernel(grid, body, params=None, consts=None):
    doc = {"name": "t", "arch": "sm_90a", "launch": {"grid": grid, "threads": 256}, "consts": consts or {},
           "params": params or [{"kind": "scalar", "name": "M", "min": 128, "divisible_by": 128},
                                {"kind": "scalar", "name": "K", "min": 64, "divisible_by": 64},
                                {"kind": "scalar", "name": "R", "min": 1}],
           "roles": [{"name": "r", "warps": [0, 8], "body": body}]}
    k, diags = load(doc)
    assert k is not None, diags
    return k


def _prover_at(k, path):
    ctx = Context(k, k)
    site = next(s for s in ctx.sites if s.path == path)
    return Prover(k, site, ctx.env(site))


def test_block_index_times_tile_fits_floor_grid():
    k = _kernel(["M / 128"], [{"op": "let", "name": "m0", "value": "bid.x * 128"}, {"op": "syncthreads"}])
    p = _prover_at(k, "/roles/0/body/1")
    assert p.le("m0 + 128", "M")
    assert not p.le("m0 + 129", "M")
    assert p.le("m0 + 64 * wg + 64", "M")  # wg in [0, 1] for 8 warps


def test_cdiv_grid_needs_divisibility():
    k = _kernel(["cdiv(R, 4)"], [{"op": "syncthreads"}])
    p = _prover_at(k, "/roles/0/body/0")
    assert not p.le("bid.x * 4 + 4", "R")
    k = _kernel(["cdiv(M, 128)"], [{"op": "syncthreads"}])
    assert _prover_at(k, "/roles/0/body/0").le("bid.x * 128 + 128", "M")


def test_loop_ranges_and_steps():
    k = _kernel([1], [{"op": "for", "var": "k", "stop": "K / 64", "body": [
        {"op": "for", "var": "kk", "stop": 64, "step": 16, "body": [{"op": "syncthreads"}]}]}])
    p = _prover_at(k, "/roles/0/body/0/body/0/body/0")
    assert p.le("k * 64 + 64", "K")
    assert p.le("kk + 16", 64)
    assert not p.le("kk + 17", 64)


def test_guards_are_used():
    k = _kernel([1], [{"op": "for", "var": "k", "stop": "K / 32", "body": [
        {"op": "if", "cond": "k + 2 < K / 32", "then": [{"op": "syncthreads"}]}]}])
    p = _prover_at(k, "/roles/0/body/0/body/0/then/0")
    assert p.le("(k + 2) * 32 + 32", "K")
    assert not p.le("(k + 3) * 32 + 32", "K")
    k = _kernel(["cdiv(R, 8)"], [{"op": "let", "name": "r", "value": "bid.x * 8 + role_warp"},
                                 {"op": "if", "cond": "r < R", "then": [{"op": "syncthreads"}]}])
    assert _prover_at(k, "/roles/0/body/1/then/0").le("r + 1", "R")
    assert not _prover_at(k, "/roles/0/body/1").le("r + 1", "R")
