"""The knowledge base: SQLModel tables and store (knowledge/models.py, knowledge/store.py).

Kept small for the agent-harness issue; the knowledge issue adds the vector store, failure
signatures and clustering, and promotion of lessons into rules/tactics/calibration.
Import `knowledge.store.Store` lazily: sqlmodel costs about a second to import.
"""

import os
from pathlib import Path
from typing import Optional


def home(path: Optional[str] = None) -> Path:
    """CAKE_HOME (default ./.cake): where the DB (knowledge.store) and Chroma (knowledge.vectors) live."""
    return Path(path or os.environ.get("CAKE_HOME") or os.path.join(os.getcwd(), ".cake"))
