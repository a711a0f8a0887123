"""A C++ writer that records, for every emitted line, the IR node path it came from."""
from __future__ import annotations

import re

MAX_LINES = 50_000  # far above any real kernel; unrolled emission over absurd tile sizes stops here


class SourceTooLarge(Exception):
    """The generated source passed MAX_LINES (lower() reports it as a diagnostic)."""


_COMMENT_BAD = re.compile(r"[^\x20-\x7e]|\*/|/\*|\\|\?\?")


def safe_comment(text: str) -> str:
    """Text that can sit inside a // comment: printable ASCII, no comment terminators, no line
    splices (a trailing backslash would continue the comment onto the next line of code)."""
    return _COMMENT_BAD.sub("_", str(text))[:200]


class Writer:
    def __init__(self):
        self.lines: list[str] = []
        self.line_map: dict[int, str] = {}
        self.depth = 0

    def line(self, text: str = "", path: str | None = None) -> None:
        if len(self.lines) >= MAX_LINES:
            raise SourceTooLarge(f"the generated source passed {MAX_LINES} lines")
        pad = "  " * self.depth
        if path is not None:
            self.line_map[len(self.lines) + 1] = path
            text = f"{text}  // {safe_comment(path)}" if text else f"// {safe_comment(path)}"
        self.lines.append(pad + text if text else "")

    def open(self, text: str, path: str | None = None) -> None:
        self.line(text + " {", path)
        self.depth += 1

    def close(self, tail: str = "") -> None:
        self.depth -= 1
        self.line("}" + tail)

    def extend_raw(self, text: str) -> None:
        for l in text.splitlines():
            self.lines.append(l)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
