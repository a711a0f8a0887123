"""The knowledge base: SQLModel tables and store (knowledge/models.py, knowledge/store.py).

Kept small for the agent-harness issue; the knowledge issue adds the vector store, failure
signatures and clustering, and promotion of lessons into rules/tactics/calibration.
Import `knowledge.store.Store` lazily: sqlmodel costs about a second to import.
"""
