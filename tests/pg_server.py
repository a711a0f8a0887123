"""A throwaway PostgreSQL server for the test suite (and for .ci/run).

    python tests/pg_server.py start [--dir D]   # prints shell exports: CAKE_TEST_PG_URL, CAKE_TEST_PG_DIR
    python tests/pg_server.py stop --dir D
    python tests/pg_server.py bindir            # where the server binaries are; exit 1 if nowhere

From Python, `start()` returns a PgServer whose `stop()` (also run at exit) removes the cluster.
The cluster lives in a temp dir, listens on 127.0.0.1 at a free port with trust auth, and runs with
fsync off (a test server: speed over durability). PostgreSQL refuses to run as root, so as root the
cluster is owned by, and run as, the `postgres` user (or `nobody`) through runuser.
"""
from __future__ import annotations

import atexit
import glob
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional

USER_DB = "postgres"      # superuser and maintenance database of the cluster


def bin_dir() -> Optional[str]:
    """Where initdb/pg_ctl live: $CAKE_PG_BIN, PATH, Debian's /usr/lib/postgresql/<v>/bin, or the
    `pgserver` wheel, which ships a server build (.ci/run's pip fallback without apt)."""
    cands = [os.environ.get("CAKE_PG_BIN", "")]
    w = shutil.which("initdb")
    cands.append(os.path.dirname(w) if w else "")
    cands += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: _version(p), reverse=True)
    spec = importlib.util.find_spec("pgserver")           # located, not imported
    if spec and spec.origin:
        cands.append(os.path.join(os.path.dirname(spec.origin), "pginstall", "bin"))
    for d in cands:
        if d and os.access(os.path.join(d, "initdb"), os.X_OK) and os.access(os.path.join(d, "pg_ctl"), os.X_OK):
            return d
    return None


def _version(path: str) -> float:
    try:
        return float(path.rstrip("/").split("/")[-2])
    except ValueError:
        return 0.0


def _run_user() -> Optional[str]:
    """None when we may run the server ourselves; else the unprivileged user to run it as."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user exists")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    def __init__(self, root: str, port: int, bindir: str, user: Optional[str]):
        self.root, self.port, self.bindir, self.user = root, port, bindir, user
        self.data = os.path.join(root, "data")
        self.url = f"postgresql+psycopg://{USER_DB}@127.0.0.1:{port}/{USER_DB}"

    def _cmd(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = [os.path.join(self.bindir, args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        # cwd=root: the server user may not be able to read the caller's cwd
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}\n{self.log()}")
        return p

    def log(self) -> str:
        try:
            with open(os.path.join(self.root, "server.log")) as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def start(self) -> "PgServer":
        self._cmd("initdb", "-D", self.data, "-U", USER_DB, "-A", "trust", "-E", "UTF8", "--no-sync",
                  "--locale=C", timeout=180)
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._cmd("pg_ctl", "start", "-w", "-t", "60", "-D", self.data, "-l", os.path.join(self.root, "server.log"),
                  "-o", opts, timeout=90)
        return self

    def stop(self) -> None:
        if os.path.isdir(self.data):
            self._cmd("pg_ctl", "stop", "-D", self.data, "-m", "immediate", "-w", check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def start(register_atexit: bool = True, root: Optional[str] = None) -> PgServer:
    bindir = bin_dir()
    if bindir is None:
        raise FileNotFoundError("PostgreSQL server binaries (initdb, pg_ctl) not found")
    user = _run_user()
    last: Exception | None = None
    for _ in range(3):                   # the free port can be taken between probe and bind: retry
        d = root or tempfile.mkdtemp(prefix="cake-pg-")
        os.makedirs(d, exist_ok=True)
        if user:
            pw = pwd.getpwnam(user)
            os.chown(d, pw.pw_uid, pw.pw_gid)
        os.chmod(d, 0o700)
        srv = PgServer(d, _free_port(), bindir, user)
        try:
            srv.start()
        except Exception as e:   # noqa: BLE001
            last = e
            srv.stop()
            continue
        if register_atexit:
            atexit.register(srv.stop)
        _wait_ready(srv.url)
        return srv
    raise RuntimeError(f"could not start PostgreSQL: {last}")


def _wait_ready(url: str, timeout: float = 30) -> None:
    import psycopg
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    t0 = time.monotonic()
    while True:
        try:
            psycopg.connect(dsn, connect_timeout=5).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() - t0 > timeout:
                raise
            time.sleep(0.2)


def _main(argv: list[str]) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["start", "stop", "bindir"])
    ap.add_argument("--dir")
    a = ap.parse_args(argv)
    if a.action == "bindir":                               # exit 1 when no server binaries are found
        print(bin_dir() or "")
        return 0 if bin_dir() else 1
    if a.action == "start":
        srv = start(register_atexit=False, root=a.dir)
        print(f"export CAKE_TEST_PG_URL='{srv.url}'\nexport CAKE_TEST_PG_DIR='{srv.root}'")
        return 0
    if not a.dir:
        ap.error("stop needs --dir")
    PgServer(a.dir, 0, bin_dir() or "", _run_user()).stop()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
