"""One launch of a library kernel, for Nsight Compute (where does a tile's time go?):

    ncu --set full -k regex:kmeans --launch-skip 2 --launch-count 1 python bench/profile_lib.py kmeans B N K
    ncu --set full -k regex:knn --launch-skip 1 --launch-count 1 python bench/profile_lib.py knn Q M k
    (an optional 5th argument: the variant's params as JSON, instead of the dispatch table's pick; k-means at
    D = $KMEANS_D when set)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    import torch
    from bench.lib_grid import kmeans_inputs, knn_inputs
    op, a, b, c = sys.argv[1], *map(int, sys.argv[2:5])
    variant = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
    if op == "kmeans":
        from cakelib import kmeans
        shape = {"B": a, "N": b, "K": c, **({"D": int(os.environ["KMEANS_D"])} if "KMEANS_D" in os.environ else {})}
        x, c0 = kmeans_inputs(shape)
        for _ in range(3):
            kmeans(x, c, 1, init=c0, variant=variant)
    else:
        from cakelib import knn
        xq, xb = knn_inputs({"Q": a, "M": b, "k": c})
        for _ in range(2):
            knn(xq, xb, c, variant=variant)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
