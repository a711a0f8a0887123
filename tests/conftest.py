import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


# ------------------------------------------------------------------ databases for the knowledge store
# The store must work on SQLite (default) and Postgres (CAKE_DB_URL): tests taking `db_url` run on
# both. Postgres comes from CAKE_TEST_PG_URL (.ci/run starts one) or a throwaway server started here
# when the binaries are installed; otherwise the postgres cases skip, saying why.
import uuid  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def pg_url():
    """URL of a Postgres server's maintenance DB (postgresql+psycopg://...)."""
    url = os.environ.get("CAKE_TEST_PG_URL")
    if url:
        return url                          # set on purpose: an unreachable server then fails, not skips
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pg_server
    if pg_server.bin_dir() is None:
        pytest.skip("PostgreSQL tests skipped: no CAKE_TEST_PG_URL and no initdb/pg_ctl on this machine "
                    "(.ci/run installs them)")
    return pg_server.start().url           # stopped and removed at exit


def _pg_admin(url: str):
    import psycopg
    from sqlalchemy.engine import make_url
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    return psycopg.connect(dsn, autocommit=True)


@pytest.fixture
def fresh_pg_db(pg_url):
    """A new empty Postgres database for one test, dropped afterwards."""
    name = f"cake_test_{uuid.uuid4().hex[:12]}"
    with _pg_admin(pg_url) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    from sqlalchemy.engine import make_url
    yield make_url(pg_url).set(database=name).render_as_string(hide_password=False)
    with _pg_admin(pg_url) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """A fresh empty knowledge DB URL, once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'cake.db'}"
    return request.getfixturevalue("fresh_pg_db")
