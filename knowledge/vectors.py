"""The vector store: Chroma collections of failures, tactics and experience notes.

Local and persistent by default (CAKE_HOME/chroma, CAKE_HOME defaulting to ./.cake like the DB);
CAKE_CHROMA_URL=http://host:8000 uses a Chroma server instead. Embeddings come from
knowledge.embedding (all-MiniLM-L6-v2 in numpy, offline); the collections are created with its
registered embedding function so Chroma records which embedding built them.

Every write is an upsert keyed by content (failures by run + key, notes by run + key, tactics by name
and passage), so re-running the end-of-run hook after a crash changes nothing. Tactic passages carry
a hash of the tactic's card: `index_tactics` re-embeds only tactics whose card changed.

chromadb is imported here only (its import takes about two seconds): CLIs and the agent import this
module lazily, where they need it.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Iterable, Optional
from urllib.parse import urlparse

from . import home

COLLECTIONS = ("failures", "tactics", "experiences")
_LOCK = threading.Lock()


def content_hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _clean_meta(meta: dict) -> dict:
    """Chroma metadata values are str / int / float / bool; None is dropped, the rest stringified."""
    out = {}
    for k, v in (meta or {}).items():
        if v is None:
            continue
        out[k] = v if isinstance(v, (str, int, float, bool)) else json.dumps(v, sort_keys=True, default=str)
    return out


def where(**filters: Any) -> Optional[dict]:
    """A Chroma `where` from equality filters; None values are ignored."""
    terms = [{k: v} for k, v in filters.items() if v is not None and v != ""]
    if not terms:
        return None
    return terms[0] if len(terms) == 1 else {"$and": terms}


class VectorStore:
    def __init__(self, path: Optional[str] = None, url: Optional[str] = None):
        os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
        import chromadb
        from chromadb.config import Settings

        from .embedding import embedding_function
        self._ef = embedding_function()          # registers the embedding with chromadb first
        settings = Settings(anonymized_telemetry=False)
        url = url if url is not None else os.environ.get("CAKE_CHROMA_URL")
        if url:
            u = urlparse(url if "://" in url else f"http://{url}")
            self.where = url
            self.client = chromadb.HttpClient(host=u.hostname or "localhost", port=u.port or (443 if u.scheme == "https" else 8000),
                                              ssl=u.scheme == "https", settings=settings)
        else:
            p = Path(path) if path else home() / "chroma"
            p.mkdir(parents=True, exist_ok=True)
            self.where = str(p)
            self.client = chromadb.PersistentClient(path=str(p), settings=settings)
        self._cols: dict = {}

    def collection(self, name: str):
        if name not in COLLECTIONS:
            raise KeyError(f"unknown collection {name!r}; one of {COLLECTIONS}")
        with _LOCK:
            if name not in self._cols:
                self._cols[name] = self.client.get_or_create_collection(
                    name, embedding_function=self._ef, configuration={"hnsw": {"space": "cosine"}})
            return self._cols[name]

    # ------------------------------------------------------------------ writing
    def upsert(self, name: str, items: Iterable[dict]) -> int:
        """Items {"id", "text", "meta"}; an item whose stored content hash is unchanged is skipped.
        Returns how many were (re-)embedded."""
        items = list({it["id"]: it for it in items}.values())
        if not items:
            return 0
        col = self.collection(name)
        items = [{"id": it["id"], "text": it["text"],
                  "meta": {**_clean_meta(it.get("meta") or {}), "hash": content_hash(it["text"], _clean_meta(it.get("meta") or {}))}}
                 for it in items]    # copies: the caller's dicts stay as they were
        got = col.get(ids=[it["id"] for it in items], include=["metadatas"])
        stored = {i: (m or {}).get("hash") for i, m in zip(got["ids"], got["metadatas"] or [])}
        todo = [it for it in items if stored.get(it["id"]) != it["meta"]["hash"]]
        if not todo:
            return 0
        from .embedding import embed
        uniq = list(dict.fromkeys(it["text"] for it in todo))     # failure messages repeat a lot
        vec = dict(zip(uniq, embed(uniq)))
        col.upsert(ids=[it["id"] for it in todo], documents=[it["text"] for it in todo],
                   metadatas=[it["meta"] for it in todo], embeddings=[vec[it["text"]].tolist() for it in todo])
        return len(todo)

    def delete(self, name: str, ids: list[str]) -> None:
        if ids:
            self.collection(name).delete(ids=ids)

    def count(self, name: str) -> int:
        return self.collection(name).count()

    # ------------------------------------------------------------------ reading
    def query(self, name: str, text: str, k: int = 5, **filters: Any) -> list[dict]:
        """The k nearest items: {"id", "text", "meta", "similarity"} (cosine), best first."""
        col = self.collection(name)
        n = col.count()
        if n == 0 or k <= 0:
            return []
        from .embedding import embed_cached
        q = embed_cached([text])[0].tolist()
        res = col.query(query_embeddings=[q], n_results=min(k, n), where=where(**filters),
                        include=["documents", "metadatas", "distances"])
        out = []
        for i, doc, meta, dist in zip(res["ids"][0], res["documents"][0], res["metadatas"][0], res["distances"][0]):
            out.append({"id": i, "text": doc, "meta": meta or {}, "similarity": 1.0 - float(dist)})
        return out

    # ------------------------------------------------------------------ tactics
    def index_tactics(self, tactics: Optional[list] = None) -> int:
        """Index every tactic's passages (tactics.base.chunks); only changed tactics are re-embedded and
        passages of removed tactics or shortened descriptions are deleted. Returns passages embedded."""
        from tactics.base import chunks, load_tactics
        tactics = tactics if tactics is not None else load_tactics()
        items = []
        for t in tactics:
            card = t.card()
            h = content_hash(card)
            for i, c in enumerate(chunks(t)):
                items.append({"id": f"{t.name}#{i}", "text": c,
                              "meta": {"tactic": t.name, "kind": t.kind, "card": h, "archs": ",".join(t.archs)}})
        col = self.collection("tactics")
        keep = {it["id"] for it in items}
        stale = [i for i in col.get(include=[])["ids"] if i not in keep]
        self.delete("tactics", stale)
        return self.upsert("tactics", items)

    def rank_tactics(self, text: str, tactics: Optional[list] = None) -> list[tuple[str, float]]:
        """(tactic name, best passage similarity), best first, from the "tactics" collection."""
        self.index_tactics(tactics)
        n = self.count("tactics")
        best: dict[str, float] = {}
        for hit in self.query("tactics", text, k=n):
            name = hit["meta"].get("tactic")
            best[name] = max(best.get(name, -1.0), hit["similarity"])
        return sorted(best.items(), key=lambda x: (-x[1], x[0]))


_DEFAULT: Optional[VectorStore] = None


def default_store() -> VectorStore:
    """One VectorStore per process and CAKE_HOME / CAKE_CHROMA_URL."""
    global _DEFAULT
    key = (str(home()), os.environ.get("CAKE_CHROMA_URL"))
    with _LOCK:
        if _DEFAULT is None or getattr(_DEFAULT, "_key", None) != key:
            _DEFAULT = VectorStore()
            _DEFAULT._key = key
        return _DEFAULT
