"""E-PRG-01: a kernel of a Program targets another arch than the program.

A Program is compiled and run for one arch: the runtime compiles every kernel for the program's
`arch` (or the device's), so a kernel that says otherwise was written against facts (wgmma, TMA,
shared-memory limits) that do not hold where it runs. Set each kernel's `arch` to the program's.
"""
CODE = "E-PRG-01"
TITLE = "every kernel of a program targets the program's arch"
STAGE = "program"


def check(ctx):
    prog = ctx.program
    for i, k in enumerate(prog.kernels):
        if k.arch != prog.arch:
            path = f"/kernels/{i}/arch"
            yield ctx.report(path, f"kernel {k.name} targets {k.arch}; the program targets {prog.arch}",
                             legal=[prog.arch], fix=[{"op": "replace", "path": path, "value": prog.arch}])
