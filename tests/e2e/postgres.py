"""A real PostgreSQL server for the runs-store tests: Debian's ``postgresql`` binaries, a
cluster made in a temporary folder, loopback and a free port, trust authentication.
PostgreSQL refuses to run as root: as root, the server runs as the ``postgres`` user
the package made."""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from .procs import free_port, wait_for


def _binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if found:
        return Path(found[0]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


BIN = _binaries()


def require_postgres() -> None:
    """Skip the calling module without PostgreSQL's server and psycopg; CI sets
    BLS_REQUIRE_POSTGRES=1 (and installs Debian's postgresql), and there either missing
    fails."""
    missing = []
    if BIN is None:
        missing.append("PostgreSQL's server (Debian: apt install postgresql)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing.append("psycopg (pip install 'bls-pipelines[postgres]')")
    if missing:
        if os.environ.get("BLS_REQUIRE_POSTGRES"):
            what = " and ".join(missing)
            raise RuntimeError(f"BLS_REQUIRE_POSTGRES is set but {what} is missing")
        pytest.skip(f"{' and '.join(missing)} is not installed", allow_module_level=True)


class PostgresServer:
    """One PostgreSQL cluster; :meth:`database` makes a fresh database on it and gives its
    URL."""

    _names = itertools.count()

    def __init__(self) -> None:
        assert BIN is not None
        # As root, in /tmp itself: the postgres user cannot enter root's own temporary
        # folders (pytest's, or a $TMPDIR made by mktemp -d).
        root = os.geteuid() == 0
        self.folder = Path(tempfile.mkdtemp(prefix="bls-pg-", dir="/tmp" if root else None))
        self.port = free_port()
        self.as_user: list[str] = []
        if root:
            user = pwd.getpwnam("postgres")
            os.chown(self.folder, user.pw_uid, user.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert BIN is not None
        data = self.folder / "data"
        subprocess.run(
            [*self.as_user, str(BIN / "initdb"), "-D", str(data), "-U", "postgres",
             "--auth=trust", "--no-sync", "-E", "UTF8"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        self.proc = subprocess.Popen(
            [*self.as_user, str(BIN / "postgres"), "-D", str(data), "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.folder}",
             "-c", "max_connections=200"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        wait_for(self._accepts, timeout=30, interval=0.05)

    def _accepts(self) -> bool:
        import psycopg

        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"postgres exited with {self.proc.returncode}")
        try:
            psycopg.connect(self.url("postgres"), connect_timeout=1).close()
            return True
        except psycopg.OperationalError:
            return False

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        """A new, empty database; its URL."""
        import psycopg

        name = f"runs{next(self._names)}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # SIGINT: PostgreSQL's "fast" shutdown, clients or not (to the process group:
            # runuser's child included).
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)
