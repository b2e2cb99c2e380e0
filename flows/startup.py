"""A pipeline process's one-off start-up costs, paid side by side before the flow starts.

Two things take seconds before the first round: TVM's tensor-intrinsic registry (~3 s with
:func:`dynatune.search.intrinsics.import_tensor_intrinsics`; the first tuning slot needs it) and, with no
``PREFECT_API_URL``, Prefect's local ephemeral API server (a uvicorn subprocess, ~5 s to come up). Done
one after the other they add up. So :func:`prestart`, called by ``dynatune tune`` before it imports
anything of Prefect:

1. spawns the ephemeral server exactly as Prefect's ``SubprocessASGIServer`` would (same uvicorn
   command, same environment), without importing Prefect;
2. imports TVM's intrinsics while the server comes up in its own process;
3. hands the running server to Prefect: it becomes the ``SubprocessASGIServer`` singleton that
   Prefect's clients start (and stop at exit), so the flow finds it running.

If anything about the early server is off (a configured API URL, a server already running, the early
one not answering), it is stopped and Prefect starts its own as usual: never worse than not trying.
This module imports neither Prefect nor TVM at import time.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import socket
import subprocess
import sys
import time


def prestart() -> None:
    early = None if os.environ.get("PREFECT_API_URL") else spawn_api_server()
    from dynatune.search.intrinsics import import_tensor_intrinsics

    import_tensor_intrinsics()

    if early is not None:
        _hand_over(*early)


def spawn_api_server(environ=None):
    """Prefect's API server as Prefect's local mode starts it (uvicorn, no UI, no background services), on a
    free loopback port, in ``environ`` (default: this process's; its ``PREFECT_HOME`` holds the database):
    ``(process, port)``, or None where Prefect is not installed. It answers ``/api/health`` when it is up."""
    spec = importlib.util.find_spec("prefect")
    if spec is None or not spec.origin:
        return None
    app_dir = os.path.dirname(
        os.path.dirname(spec.origin)
    )  # what Prefect passes: prefect.__module_path__.parent
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **(os.environ if environ is None else environ),
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
    }
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--app-dir",
                app_dir,
                "--factory",
                "prefect.server.api.server:create_app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "error",
                "--lifespan",
                "on",
            ],
            env=env,
        )
    except OSError:
        return None
    return proc, port


def stop_api_server(proc) -> None:
    """Stop a server :func:`spawn_api_server` started (killed if it does not stop within 5 s)."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _hand_over(proc, port: int) -> None:
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_EPHEMERAL_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
    )

    server = SubprocessASGIServer()
    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value() or server.running:
        stop_api_server(proc)  # a server is configured (e.g. in a Prefect profile), or one runs already
        return
    if wait_for_api_server(proc, port, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()):
        server.port, server.server_process, server.running = port, proc, True
        atexit.register(server.stop)
    elif proc.poll() is None:
        stop_api_server(proc)  # not up in time: Prefect starts its own on the flow's first call


def wait_for_api_server(proc, port: int, timeout_s: float) -> bool:
    """Whether a server :func:`spawn_api_server` started answers ``/api/health`` within ``timeout_s``
    (False as soon as its process exits)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    url = f"http://127.0.0.1:{port}/api/health"
    with httpx.Client() as client:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if client.get(url).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    return False


def check_prefect_api(url: str | None) -> None:
    """A configured Prefect API (``prefect_api_url``, else ``$PREFECT_API_URL``) answers, or one line says it
    does not, before anything is written (the flow would fail with Prefect's "Failed to reach API")."""
    if url:
        from dynatune.tasks.reachability import check_reachable

        check_reachable(
            url,
            "Prefect API",
            "start the Prefect server, fix prefect_api_url / PREFECT_API_URL, or unset it to run Prefect "
            "locally",
        )
