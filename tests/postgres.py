"""A real PostgreSQL server on loopback for the tests: the binaries of the ``pgserver`` wheel (a test
dependency), a fresh cluster in a temporary directory, a password user, stopped on exit.

PostgreSQL refuses to run as root; as root (CI), the cluster is owned by and run as ``nobody``.
"""

import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile

from servers import free_port


def _bin_dir() -> str:
    spec = importlib.util.find_spec("pgserver")  # its binaries only: importing it starts nothing
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the pgserver wheel (PostgreSQL's binaries) is not installed: pip install -e '.[test]'"
        )
    return os.path.join(list(spec.submodule_search_locations)[0], "pginstall", "bin")


class LoopbackPostgres:
    """``with LoopbackPostgres() as pg``: ``pg.url`` (no password), ``pg.password`` (for ``PGPASSWORD``)."""

    def __init__(self, user: str = "tuner", database: str = "dynatune"):
        self.user, self.database = user, database
        self.password = "s3cret-" + os.urandom(6).hex()
        self.root = tempfile.mkdtemp(prefix="pg-")  # short: the socket path must stay under 107 bytes
        self.data = os.path.join(self.root, "data")
        self.port = free_port()
        self.bin = _bin_dir()
        self._as = pwd.getpwnam("nobody") if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def _run(self, exe: str, *args: str, timeout: float = 120) -> str:
        def drop_root():
            if self._as is not None:
                os.setgid(self._as.pw_gid)
                os.setuid(self._as.pw_uid)

        p = subprocess.run(
            [os.path.join(self.bin, exe), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=drop_root,
            cwd=self.root,
            env={k: v for k, v in os.environ.items() if not k.startswith("PG")},
        )
        if p.returncode != 0:
            raise RuntimeError(f"{exe} failed ({p.returncode}): {p.stderr[-2000:]}")
        return p.stdout

    def __enter__(self) -> "LoopbackPostgres":
        os.chmod(self.root, 0o755)
        if self._as is not None:
            os.chown(self.root, self._as.pw_uid, self._as.pw_gid)
        # local socket: trust (the set-up below); TCP on loopback: passwords only
        self._run(
            "initdb",
            "-D",
            self.data,
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
        )
        self._run(
            "pg_ctl",
            "-D",
            self.data,
            "-w",
            "-t",
            "60",
            "-l",
            os.path.join(self.root, "log"),
            "-o",
            f"-h 127.0.0.1 -p {self.port} -k {self.root}",
            "start",
        )
        sql = (
            f"CREATE USER {self.user} PASSWORD '{self.password}';"
            f"CREATE DATABASE {self.database} OWNER {self.user};"
        )
        for stmt in sql.rstrip(";").split(";"):
            self._run(
                "psql",
                "-h",
                self.root,
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                stmt,
            )
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
