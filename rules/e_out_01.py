"""E-OUT-01: an output tensor no statement writes.

A tensor param declared `access: "write"` is the kernel's result; if no statement stores to it (stg,
a TMA / bulk store, red_add, scatter_add) its contents after the launch are whatever the allocation
held, which a test that reuses memory can even mistake for a right answer. Usually the store sits in
a branch the kernel never builds (a variant's path) or names another tensor. In a Program a kernel
may declare the program's outputs that another of its kernels writes (the tensors are shared by
name). Store the result, or declare the tensor `read` / `readwrite`.
"""
from cake_ir.analysis.sync import smem_refs
from cake_ir.nodes import TensorParam
from cake_ir.walk import statements

CODE = "E-OUT-01"
TITLE = "every output tensor is written"
STAGE = "source"


def check(ctx):
    k = ctx.kernel
    written = {ref.buf for s in ctx.sites for ref, write in smem_refs(s.node) if write}
    for other in (ctx.program.kernels if ctx.program is not None else ()):
        if other.name != ctx.source.name:
            written |= {ref.buf for s in statements(other) for ref, write in smem_refs(s.node) if write}
    for pi, p in enumerate(k.params):
        if isinstance(p, TensorParam) and p.access == "write" and p.name not in written:
            yield ctx.report(f"/params/{pi}", f"output tensor {p.name} (access write) is never written by the kernel",
                             legal=["a stg / tma_store / red_add / scatter_add to it", "access read or readwrite"])
