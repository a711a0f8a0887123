"""Tactics: named, parametrised IR-to-IR transformations with preconditions (plugins).

Each module here that defines `TACTICS = [Tactic, ...]` contributes tactics; installed packages can
add more through the `cake.tactics` entry point group. `load_tactics()` lists them; the search
proposer (agent/search.py) applies them, and their descriptions are retrieved into LLM prompts.
tactics/base.py documents genomes and the Tactic interface; tactics/jsonpatch.py is RFC 6902.
"""
from .base import Tactic, TacticError, get_tactic, load_tactics, retrieve

__all__ = ["Tactic", "TacticError", "get_tactic", "load_tactics", "retrieve"]
