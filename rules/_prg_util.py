"""Helpers shared by the program rules (E-PRG-*): where each workspace is declared in the kernels."""
from cake_ir.nodes import TensorParam


def workspace_params(program, name: str):
    """(kernel index, param index, TensorParam) of every kernel param named `name`, in launch order."""
    for i, k in enumerate(program.kernels):
        for j, p in enumerate(k.params):
            if isinstance(p, TensorParam) and p.name == name:
                yield i, j, p
