"""Secret-bearing settings: URLs with credentials (tracking store, Prefect API, a database).

- What is *recorded* (the work dir's config.json, MLflow params and tags, summaries, logs) goes through
  :func:`mask`: ``https://user:token@host`` becomes ``https://user:***@host``, and query values named like
  a secret (``password=``, ``token=``, ...) become ``***``.
- What is *passed on* (Prefect flow and deployment parameters, which the Prefect UI shows) goes through
  :func:`reference`: a value with credentials is put in an environment variable of this process (its
  children inherit it) and replaced by ``env:NAME``. :func:`resolve` turns ``env:NAME`` back into the
  value when the config is read, so a config file can also name its secrets that way
  (``tracking: {uri: env:MLFLOW_TRACKING_URI}``).
"""

from __future__ import annotations

import os
import re
import urllib.parse

from dynatune.errors import DynatuneError

MASK = "***"
ENV_PREFIX = "env:"
_SECRET_QUERY = re.compile(r"pass(word)?|pwd|secret|token|key|sig(nature)?|credential", re.IGNORECASE)


def has_credentials(value) -> bool:
    return isinstance(value, str) and mask(value) != value


def mask(value):
    """``value`` with the password of its URL userinfo and secret query values replaced by ``***``
    (a userinfo without a password is a token: masked whole). Anything else is returned unchanged."""
    if not isinstance(value, str) or "://" not in value:
        return value
    try:
        parts = urllib.parse.urlsplit(value)
    except ValueError:
        return value
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, sep, _ = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{host}" if sep else f"{MASK}@{host}"
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_QUERY.search(k) for k, _ in pairs):
            query = "&".join(f"{k}={MASK if _SECRET_QUERY.search(k) else v}" for k, v in pairs)
    if netloc == parts.netloc and query == parts.query:
        return value
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")


def mask_text(text: str) -> str:
    """Every URL inside a free text (an error message, a log line) masked."""
    return _URL.sub(lambda m: mask(m.group(0)), text)


def mask_all(obj):
    """:func:`mask` applied to every string in nested dicts and lists."""
    if isinstance(obj, dict):
        return {k: mask_all(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [mask_all(v) for v in obj]
    return mask(obj)


def resolve(value, key: str = "setting"):
    """``env:NAME`` -> the value of environment variable NAME (a one-line error when it is unset)."""
    if isinstance(value, str) and value.startswith(ENV_PREFIX):
        name = value[len(ENV_PREFIX) :]
        if name not in os.environ:
            raise DynatuneError(
                f"{key} refers to environment variable {name}, which is not set",
                f"export {name}=... before running",
            )
        return os.environ[name]
    return value


def reference(value, env_name: str):
    """A value safe to pass as a parameter: ``env:NAME`` when it has credentials (the value goes into this
    process's environment under ``env_name``), else the value itself."""
    if not has_credentials(value):
        return value
    os.environ[env_name] = value
    return ENV_PREFIX + env_name
