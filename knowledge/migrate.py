"""Additive schema migration: bring an existing knowledge DB up to knowledge/models.py.

Why: `.cake/cake.db` files (and Postgres databases) made by an older schema lack newer tables and
columns, and `create_all` only creates missing *tables*. On every engine creation we therefore
  1. create missing tables (with their indexes and constraints),
  2. ADD missing columns: nullable ones as they are; NOT NULL ones with a scalar default as
     `NOT NULL DEFAULT <value>` (old rows get the default); any other as nullable (old rows have
     no value to give them), with a foreign key where the model has one,
  3. create missing non-unique / unique indexes.
Nothing is dropped, renamed or retyped. Unique constraints missing from an old table are reported by
Store.integrity_report's duplicate check rather than added (SQLite cannot ALTER them in).

Several processes may open the same DB at once (evaluation workers), so the migration runs in one
transaction holding a lock: a Postgres advisory lock, SQLite's write lock (BEGIN IMMEDIATE).
"""
from __future__ import annotations

from sqlalchemy import inspect, literal
from sqlalchemy.engine import Connection, Engine
from sqlmodel import SQLModel

from . import models  # noqa: F401  (registers the tables on SQLModel.metadata)

_PG_LOCK_KEY = 0x43414B45   # "CAKE": advisory lock id serialising migrations on one Postgres DB


def migrate(engine: Engine) -> list[str]:
    """Apply the additive migration; returns what it did (empty when the schema was current)."""
    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        elif conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK_KEY})")
        done = _migrate(conn)
        conn.commit()
    return done


def _migrate(conn: Connection) -> list[str]:
    md, done = SQLModel.metadata, []
    insp = inspect(conn)
    existing = set(insp.get_table_names())
    missing = [t for t in md.sorted_tables if t.name not in existing]
    if missing:
        md.create_all(conn, tables=missing)
        done += [f"create table {t.name}" for t in missing]
    q = conn.dialect.identifier_preparer.quote
    for t in md.sorted_tables:
        if t.name not in existing:
            continue
        have = {c["name"] for c in insp.get_columns(t.name)}
        for col in t.columns:
            if col.name in have:
                continue
            ddl = f"ALTER TABLE {q(t.name)} ADD COLUMN {q(col.name)} {col.type.compile(dialect=conn.dialect)}"
            d = col.default
            if not col.nullable and d is not None and getattr(d, "is_scalar", False):
                val = literal(d.arg, type_=col.type).compile(dialect=conn.dialect,
                                                            compile_kwargs={"literal_binds": True})
                ddl += f" NOT NULL DEFAULT {val}"
            for fk in col.foreign_keys:   # SQLite accepts REFERENCES in ADD COLUMN when the default is NULL
                if col.nullable or d is None:
                    ddl += f" REFERENCES {q(fk.column.table.name)}({q(fk.column.name)})"
            conn.exec_driver_sql(ddl)
            done.append(f"add column {t.name}.{col.name}")
        have_ix = {i["name"] for i in insp.get_indexes(t.name)}
        for ix in t.indexes:
            if ix.name not in have_ix:
                ix.create(conn, checkfirst=False)
                done.append(f"create index {ix.name}")
    return done
