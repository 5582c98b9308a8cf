"""A real PostgreSQL server on loopback for the tests (Debian's `postgresql` package), with a
password, so that masking is tested against the real thing."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port

PASSWORD = "s3cret-pw"


def _binary(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _as_server_user(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run it as the `postgres` user there."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """postgresql+psycopg2://postgres:PASSWORD@127.0.0.1:PORT/postgres, or skip."""
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("no PostgreSQL server here (Debian: apt-get install postgresql)")
    pytest.importorskip("psycopg2", reason="no psycopg2 (pip install psycopg2-binary)")
    data = Path(tempfile.mkdtemp(prefix="advisor-pg-"))
    (data / "pw").write_text(PASSWORD)
    if os.geteuid() == 0:
        shutil.chown(data, "postgres")
        shutil.chown(data / "pw", "postgres")
    cluster, port = data / "cluster", free_port()
    subprocess.run(
        _as_server_user(
            [initdb, "-D", str(cluster), "-U", "postgres", "--auth=scram-sha-256",
             f"--pwfile={data / 'pw'}"]
        ),
        check=True, capture_output=True,
    )  # fmt: skip
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {data}"
    start = [pg_ctl, "-D", str(cluster), "-o", options, "-l", str(data / "log"), "-w", "start"]
    subprocess.run(_as_server_user(start), check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg2://postgres:{PASSWORD}@127.0.0.1:{port}/postgres"
    finally:
        stop = [pg_ctl, "-D", str(cluster), "-m", "immediate", "stop"]
        subprocess.run(_as_server_user(stop), check=False, capture_output=True)
        shutil.rmtree(data, ignore_errors=True)
