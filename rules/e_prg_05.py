"""E-PRG-05: two kernels of a program declare the same scalar param with different dtypes.

The task passes one value per scalar name and the runtime hands it to every kernel that names it;
each kernel packs it by its own declared type, so an i32 in one kernel and an i64 or f32 in another
would read the same value as two different things. Declare it with one dtype everywhere.
"""
from cake_ir.nodes import ScalarParam

CODE = "E-PRG-05"
TITLE = "a scalar has one dtype across the program's kernels"
STAGE = "program"


def check(ctx):
    first: dict[str, tuple[str, str]] = {}
    for i, k in enumerate(ctx.program.kernels):
        for j, p in enumerate(k.params):
            if not isinstance(p, ScalarParam):
                continue
            at = f"/kernels/{i}/params/{j}"
            if p.name not in first:
                first[p.name] = (p.dtype, at)
                continue
            dtype, where = first[p.name]
            if p.dtype != dtype:
                yield ctx.report(f"{at}/dtype", f"scalar {p.name} is {p.dtype} in kernel {k.name}; {where} declares it "
                                 f"{dtype}", legal=[dtype], related=[where])
