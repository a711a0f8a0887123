"""Write every task's seed programs to tasks/<task>/seeds/<name>.json (golden files CI checks)."""
import importlib
import pathlib
import sys

from cake_ir.io import dumps

TASKS = ("softmax", "gemm", "knn", "knn_ip", "kmeans", "kda", "kda_decode")
ROOT = pathlib.Path(__file__).resolve().parent


def seed_programs():
    for task in TASKS:
        mod = importlib.import_module(f"tasks.{task}.programs")
        for name, make in mod.SEEDS.items():
            yield task, name, make()


def main(check: bool = False) -> int:
    stale = []
    for task, name, k in seed_programs():
        path = ROOT / task / "seeds" / f"{name}.json"
        text = dumps(k) + "\n"
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
            print(path)
    if stale:
        print("stale seed files (run python -m tasks.export_seeds):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(check="--check" in sys.argv))
