"""Switching a SQLite connection to WAL mode, robust to racing openers (no sqlalchemy: the agent's
checkpoint connection uses it too, on paths that do not otherwise import the store)."""
from __future__ import annotations

import random
import sqlite3
import time


def enable_wal(cur, deadline_s: float = 30.0) -> None:  # noqa: ANN001
    """PRAGMA journal_mode=WAL, again while another connection holds the lock.

    Switching a fresh DB file to WAL takes an exclusive lock; when several new connections race for it
    (evaluation workers opening one store), SQLite answers SQLITE_BUSY at once instead of calling the
    busy handler (waiting there could deadlock), so the connect timeout does not cover it."""
    t0 = time.monotonic()
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            msg = str(e).lower()
            if ("locked" not in msg and "busy" not in msg) or time.monotonic() - t0 > deadline_s:
                raise
        time.sleep(random.uniform(0.001, 0.02))   # jitter: let the winner finish the switch
