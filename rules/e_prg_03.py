"""E-PRG-03: a workspace is read before any kernel writes it.

The runtime allocates workspaces without clearing them, so the first kernel (in launch order) that
declares a workspace param must write it (`access: write` or `readwrite`); one that only reads it
reads whatever the allocator left there. Make the producing kernel come first, or give it
`access: write`.
"""
from rules._prg_util import workspace_params

CODE = "E-PRG-03"
TITLE = "a workspace is written by the first kernel that uses it"
STAGE = "program"


def check(ctx):
    prog = ctx.program
    for wi, w in enumerate(prog.workspace):
        first = next(iter(workspace_params(prog, w.name)), None)
        if first is None:
            continue          # unused: W-PRG-04
        i, j, p = first
        if p.access == "read":
            path = f"/kernels/{i}/params/{j}/access"
            yield ctx.report(path, f"kernel {prog.kernels[i].name} is the first to use workspace {w.name} and only "
                             "reads it: nothing has written it yet (workspaces are not zeroed)",
                             legal=["write", "readwrite"], related=[f"/workspace/{wi}"])
