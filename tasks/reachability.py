"""Before anything is written: the MLflow tracking server (or the directory of a SQLite store) answers.

An unreachable server is one line naming it (its URL masked), found before tuning starts, not after an hour.
"""

from __future__ import annotations

import os
import urllib.request

from dynatune.errors import DynatuneError
from dynatune.secrets import mask
from dynatune.tasks.mlflow_store import sqlite_path


def check_tracking_uri(uri: str) -> None:
    """Fail before tuning starts (not after an hour) when a remote tracking server does not answer."""
    if uri.startswith(("http://", "https://")):
        check_reachable(
            uri,
            "MLflow tracking server",
            "start it, fix tracking.uri / MLFLOW_TRACKING_URI, or unset it to use a local SQLite store",
        )
    elif (path := sqlite_path(uri)) is not None:
        d = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as exc:
            raise DynatuneError(f"cannot create the MLflow store directory {d} ({exc.strerror})") from None


def check_reachable(url: str, what: str, hint: str) -> None:
    """One line naming ``what`` (its URL masked) when ``<url>/health`` does not answer within 5 s."""
    try:
        request = _health_request(url)
    except ValueError:  # its message may quote a piece of the password ("Port could not be cast ...")
        raise DynatuneError(
            f"{what} URL {mask(url)} does not parse",
            "percent-encode the reserved characters (/ # ? @ % :) of its user name and password",
        ) from None
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            resp.read(64)
    except Exception as exc:  # noqa: BLE001 - refused, timed out, a URL that does not parse, an HTTP error
        reason = getattr(exc, "reason", None) or exc
        raise DynatuneError(f"{what} {mask(url)} is unreachable ({mask(str(reason))})", hint) from None


def _health_request(uri: str):
    """GET <uri>/health, with the URL's credentials (if any) as basic auth, not in the URL."""
    import base64
    import urllib.parse

    parts = urllib.parse.urlsplit(uri.rstrip("/") + "/health")
    req = urllib.request.Request(
        urllib.parse.urlunsplit(
            parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else ""))
        )
    )
    if parts.username is not None:
        token = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        req.add_header("Authorization", "Basic " + base64.b64encode(token.encode()).decode())
    return req
