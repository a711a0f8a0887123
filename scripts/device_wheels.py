"""Assemble the wheels the GPU machine lacks into .whl/ (git-ignored) for `device` runs.

    python scripts/device_wheels.py [--agent] [--baselines]

The GPU image has python3.12, numpy, torch, cuda-python and pytest but not pydantic, langgraph,
sqlmodel, ... . This downloads cp312 manylinux wheels of the versions installed here (so both
machines run the same code) with --no-deps; the device command then runs
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
litellm is deliberately absent (44 MB; imported only when a model is configured); so are chromadb and
the MiniLM weights (over the 64 MiB carry limit): the vector store is optional at run time.
--baselines adds the pure-Python Triton baselines the kda/kmeans/knn tasks time against (pinned to the
versions the design notes measured; torch and triton are already on the GPU image).
"""
import argparse
import pathlib
import subprocess
import sys
from importlib import metadata

CORE = ["pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions"]
AGENT = ["langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite", "langgraph-prebuilt", "langgraph-sdk",
         "langchain-core", "langchain-protocol", "langsmith", "sqlmodel", "sqlalchemy", "jsonpatch", "jsonpointer",
         "orjson", "ormsgpack", "xxhash", "uuid-utils", "zstandard", "tenacity", "requests-toolbelt", "httpx",
         "httpcore", "h11", "anyio", "sniffio", "websockets", "greenlet", "sqlite-vec", "aiosqlite", "distro",
         "requests", "urllib3", "idna", "certifi", "charset-normalizer", "packaging", "pyyaml", "jsonschema"]
BASELINES = ["fla-core==0.6.0", "flash-kmeans==0.3.1", "flashlib==0.4.0"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_5_x86_64", "manylinux1_x86_64"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", action="store_true", help="also the agent harness's dependencies")
    ap.add_argument("--baselines", action="store_true", help="also fla-core, flash-kmeans, flashlib")
    ap.add_argument("--dest", default=".whl")
    args = ap.parse_args()
    dest = pathlib.Path(args.dest)
    dest.mkdir(exist_ok=True)
    names = CORE + (AGENT if args.agent else [])
    pins = []
    for n in names:
        try:
            pins.append(f"{n}=={metadata.version(n)}")
        except metadata.PackageNotFoundError:
            continue  # not installed here: the harness does not need it
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    if args.baselines:
        pins += BASELINES
    failed = []
    for pin in pins:
        if subprocess.run(cmd + [pin]).returncode != 0:
            failed.append(pin)
    size = sum(f.stat().st_size for f in dest.glob("*.whl"))
    print(f"{len(pins) - len(failed)} wheels in {dest} ({size / 2**20:.1f} MiB)" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
