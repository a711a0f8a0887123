"""W-PRG-04: a workspace no kernel of the program uses.

The runtime still allocates it for every launch shape (memory and an allocation for nothing);
usually a kernel param was renamed. Remove the entry or name it in the kernel that should use it.
"""
from rules._prg_util import workspace_params

CODE = "W-PRG-04"
TITLE = "every workspace is used by some kernel"
STAGE = "program"


def check(ctx):
    prog = ctx.program
    for wi, w in enumerate(prog.workspace):
        if next(iter(workspace_params(prog, w.name)), None) is None:
            yield ctx.report(f"/workspace/{wi}", f"no kernel declares workspace {w.name}",
                             fix=[{"op": "remove", "path": f"/workspace/{wi}"}])
