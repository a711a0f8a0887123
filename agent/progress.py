"""Progress display: a live block on a terminal, plain lines otherwise.

Shows candidates per stage (the funnel), failures by code, the best time and its speedup (vs the
baseline when measured, vs the best seed's prediction in a dry run, labelled as such), strategy
shares, and what the workers are doing (GPU use). On a terminal the block is redrawn in place; when
stdout is not a terminal (CI, a pipe, a file) every update is one plain line and events are lines.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Optional


TICK_S = float(os.environ.get("CAKE_PROGRESS_TICK_S", "5"))   # seconds between progress lines while jobs run


def fmt_s(s: Optional[float]) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


class Progress:
    def __init__(self, stream=None, tty: Optional[bool] = None, quiet: bool = False):
        self.stream = stream or sys.stdout
        if tty is None:
            tty = bool(getattr(self.stream, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb"
        self.tty = tty
        self.quiet = quiet
        self._lines = 0
        self._last_write = time.monotonic()
        self.snapshot: dict = {}
        self.tick_s = TICK_S

    def _write(self, text: str) -> None:
        self._last_write = time.monotonic()
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def _clear(self) -> None:
        if self.tty and self._lines:
            self._write(f"\x1b[{self._lines}F\x1b[J")
            self._lines = 0

    def event(self, text: str) -> None:
        if self.quiet:
            return
        self._clear()
        self._write(text.rstrip() + "\n")
        if self.tty and self.snapshot:
            self._draw()

    def final(self, text: str) -> None:
        """The end-of-run summary: printed even with --quiet."""
        self._clear()
        self._write(text.rstrip() + "\n")

    def update(self, snap: dict, force_line: bool = False) -> None:
        self.snapshot = snap
        if self.quiet:
            return
        if self.tty:
            self._clear()
            self._draw()
        elif force_line or snap.get("node") in (None, "reflect"):
            self._write(self.line(snap) + "\n")

    def tick(self, snap: dict, activity: list) -> None:
        """While jobs run: the progress with what each busy worker is doing, at most every `tick_s`
        seconds (a line, or the block redrawn on a terminal)."""
        if self.quiet or time.monotonic() - self._last_write < self.tick_s:
            return
        snap = {**snap, "activity": self.activity_text(activity)}
        self.snapshot = snap
        if self.tty:
            self._clear()
            self._draw()
        else:
            self._write(self.line(snap) + "\n")

    @staticmethod
    def activity_text(activity: list) -> str:
        if not activity:
            return "waiting for workers"
        return "; ".join(f"{'GPU ' + str(a['gpu']) if a.get('gpu') is not None else 'CPU'} {a.get('job') or '?'} "
                         f"{a.get('stage') or 'starting'} {a.get('seconds', 0):.0f}s" for a in activity[:4]) \
            + (f"; +{len(activity) - 4} more" if len(activity) > 4 else "")

    def _draw(self) -> None:
        lines = self.block(self.snapshot)
        self._write("\n".join(lines) + "\n")
        self._lines = len(lines)

    def close(self) -> None:
        if self.tty and self._lines:
            self._lines = 0  # leave the last block on screen

    # ------------------------------------------------------------------ formatting
    @staticmethod
    def best_text(s: dict) -> str:
        b = s.get("best") or {}
        if not b:
            return "best -"
        label = "measured" if b.get("measured") else "predicted, unmeasured"
        sp = ""
        if b.get("speedup") is not None:
            sp = f" {b['speedup']:.2f}x vs {b.get('speedup_vs')}"
        return f"best {fmt_s(b.get('score_s'))} ({label}){sp} [{b.get('name')} {b.get('hash', '')[:8]}]"

    @staticmethod
    def rate_text(s: dict) -> str:
        """Candidates per minute of run time and where that time went (wall seconds per graph node)."""
        el = float(s.get("elapsed_s") or 0.0)
        n = int(s.get("n_evaluated") or 0)
        rate = f"{n / el * 60:.1f} candidates/min" if el > 0 else "- candidates/min"
        spent = s.get("node_s") or {}
        where = ", ".join(f"{k} {v:.0f}s" for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if v >= 0.5)
        return f"{n} evaluated in {el:.0f}s ({rate})" + (f"; time by node: {where}" if where else "")

    @staticmethod
    def funnel_text(s: dict) -> str:
        f = s.get("funnel") or {}
        order = ["proposed", "verify", "compile", "test", "profile", "confirm"]
        return " > ".join(f"{k} {f.get(k, 0)}" for k in order
                          if not (s.get("dry_run") and k in ("test", "profile", "confirm")))

    @staticmethod
    def fail_text(s: dict, k: int = 5) -> str:
        fc = s.get("failures_by_code") or {}
        if not fc:
            return "failures none"
        top = sorted(fc.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        return "failures " + ", ".join(f"{c} {n}" for c, n in top)

    @staticmethod
    def gpu_text(s: dict) -> str:
        u = s.get("workers") or {}
        if s.get("dry_run"):
            return f"GPU none (dry run: unmeasured); compile workers {u.get('compile_workers', '?')} ({u.get('kind', 'local')})"
        gpus = u.get("gpus") or []
        return (f"GPU {','.join(map(str, gpus)) or '-'} busy {u.get('busy', 0)}/{len(gpus)}; "
                f"{u.get('gpu_s', 0.0):.0f} GPU-s in {sum((u.get('jobs') or {}).values())} jobs; "
                f"restarts {u.get('restarts', 0)} ({u.get('kind', 'local')})")

    @staticmethod
    def strat_text(s: dict) -> str:
        parts = []
        for n, st in (s.get("strategies") or {}).items():
            flag = "" if st.get("active", True) else " stopped"
            flag += " plateau" if st.get("plateau") else ""
            parts.append(f"{n} {st.get('weight', 0):.0%} best {fmt_s(st.get('best_s'))}{flag}")
        return "strategies " + "; ".join(parts) if parts else ""

    def line(self, s: dict) -> str:
        head = f"[{s.get('run', '?')}] it {s.get('iteration', 0)} cand {s.get('n_proposed', 0)}/{s.get('max', '?')}"
        node = f"{s['node']}: {s['activity']}" if s.get("activity") else ""
        return " | ".join(x for x in [head, node, self.funnel_text(s), self.fail_text(s, 3), self.best_text(s),
                                      self.gpu_text(s), f"{s.get('elapsed_s', 0):.0f}s"] if x)

    def block(self, s: dict) -> list[str]:
        node = s.get("node")
        return [f"CAKE {s.get('run', '?')}  task {s.get('task')}  iteration {s.get('iteration', 0)}  "
                f"candidates {s.get('n_proposed', 0)}/{s.get('max', '?')}  {s.get('elapsed_s', 0):.0f}s"
                + (f"  [{node}]" if node else ""),
                "  " + self.funnel_text(s),
                "  " + self.fail_text(s),
                "  " + self.best_text(s),
                "  " + self.strat_text(s),
                "  " + self.gpu_text(s)] + (["  now: " + s["activity"]] if s.get("activity") else [])


def now() -> float:
    return time.monotonic()
