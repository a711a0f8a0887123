"""The example kernels on a real GPU (skipped cleanly without one): correct against float64."""
import pytest

from gpu_backend.driver import gpu_available

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (gpu_available() and torch.cuda.is_available()),
                                                  reason="needs a CUDA GPU")]


def _rel(out, ref):
    out = out.double()
    assert torch.isfinite(out).all(), "non-finite output (unwritten NaN poison?)"
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


def _run(k, tensors, scalars, arch=None):
    from cake_ir.compiler import compile_kernel
    from gpu_backend.runner import CompiledKernel
    res = compile_kernel(k, arch=arch)
    assert res.ok, [d.short() for d in res.diagnostics]
    ck = CompiledKernel(k.model_copy(update={"arch": arch}) if arch else k, res)
    ck(tensors, scalars)
    torch.cuda.synchronize()


def test_softmax_matches_float64():
    from tasks.softmax.programs import softmax_row
    M, N = 1000, 4096
    X = (torch.randn(M, N, device="cuda") * 4).to(torch.bfloat16)
    Y = torch.full_like(X, float("nan"))
    _run(softmax_row(N), {"X": X, "Y": Y}, {"M": M})
    assert _rel(Y, torch.softmax(X.double(), -1)) < 1e-2


@pytest.mark.parametrize("which", ["wgmma", "mma"])
def test_gemm_matches_float64(which):
    from tasks.gemm.programs import gemm_mma_sm80, gemm_wgmma_sm90a
    M, N, K = 512, 768, 1024
    A = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    B = torch.randn(N, K, device="cuda").to(torch.bfloat16)
    C = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    k, arch = (gemm_wgmma_sm90a(), None) if which == "wgmma" else (gemm_mma_sm80(), "sm_90a")
    _run(k, {"A": A, "B": B, "C": C}, {"M": M, "N": N, "K": K}, arch)
    assert _rel(C, A.double() @ B.double().T) < 1e-2
