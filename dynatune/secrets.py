"""Secret-bearing settings: URLs with credentials (tracking store, Prefect API, a database).

- What is *recorded* (the work dir's config.json, MLflow params and tags, summaries, logs) goes through
  :func:`mask`: ``https://user:token@host`` becomes ``https://user:***@host``, and query values named like
  a secret (``password=``, ``token=``, ...) become ``***``.
- What is *passed on* (Prefect flow and deployment parameters, which the Prefect UI shows) goes through
  :func:`reference`: a value with credentials is put in an environment variable of this process (its
  children inherit it) and replaced by ``env:NAME``. :func:`resolve` turns ``env:NAME`` back into the
  value when the config is read, so a config file can also name its secrets that way, in any setting
  (``tracking: {uri: env:MLFLOW_TRACKING_URI}``).
- What is *logged* by a process that runs flows goes through :func:`mask_log_records` (every log record's
  message and traceback masked, whichever logger writes it: Prefect's run logs included).

"URL" here is anything URL-shaped: with a scheme or without one (``alice:pw@host``), its password holding
any character (``/``, ``#``, ``@``, ``?``, ``%``). One function, :func:`mask`, decides what is masked.
"""

from __future__ import annotations

import logging
import os
import re

from dynatune.errors import DynatuneError

MASK = "***"
ENV_PREFIX = "env:"
_SECRET_QUERY = re.compile(r"pass(word)?|pwd|secret|token|key|sig(nature)?|credential", re.IGNORECASE)


def has_credentials(value) -> bool:
    return isinstance(value, str) and mask(value) != value


def mask(value):
    """``value`` with every credential in it replaced by ``***``: the password of a URL's userinfo (a
    userinfo without a password is a token: masked whole), with or without a scheme (``alice:pw@host``),
    whatever characters the password holds (``/``, ``#``, ``@``, ``?``, ``%``), and query values named like a
    secret. A text with spaces (an error message, a log line, a command line) has each URL in it masked.
    Anything that is not a string is returned unchanged."""
    if not isinstance(value, str):
        return value
    return _mask_url(value) if value and not _SPACE.search(value) else mask_text(value)


def mask_text(text: str) -> str:
    """Every URL inside a free text (an error message, a log line, a command line) masked."""
    return _URL_SPAN.sub(lambda m: _mask_url(m.group(0)), text)


_SPACE = re.compile(r"\s")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# what may follow a userinfo's "@": a host (a name, an IPv4 or a bracketed IPv6 address; empty for a socket
# path, as libpq allows), an optional port, then the end or a character that cannot continue a host
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]*\]|[\w.~%-]*)(?::\d*)?(?![\w.~%:\[\]@-])")
_USER = re.compile(r"[\w.~+%!$&'()*,;=-]*")
_QUERY_PAIR = re.compile(r"(?<=[?&;])([^=&;#]*)=([^&;#]*)")
# a URL inside a text: with a scheme, or ``user:password@...`` at the start of a word (or after = , ( [ { <)
_URL_SPAN = re.compile(
    _SCHEME.pattern + r"[^\s'\"<>]+"
    r"|(?<![^\s'\"(\[{<=,])[\w.~+%!$&*-]+:(?!//)[^\s'\"<>]*@[^\s'\"<>]*"
)


def _mask_url(url: str) -> str:
    """One URL-shaped word masked. The userinfo ends at the LAST "@" that a host follows, so a password or
    token with "@", "/", "#", "?" or "%" in it is masked whole. An "@" in the path of a URL with a scheme
    masks what precedes it too: masked too much, never too little."""
    scheme = _SCHEME.match(url)
    start = scheme.end() if scheme else 0
    at = _userinfo_end(url, start)
    if at is None:
        return _mask_query(url) if scheme else url
    user, colon, _ = url[start:at].partition(":")
    if not _USER.fullmatch(user):
        if not scheme:
            return url
        user, colon = "", ""  # not a user name: the whole userinfo is the secret
    elif not (colon and user) and not scheme:
        return url  # "user@host", ":x@host": nothing secret without a scheme
    return _mask_query(url[:start] + (f"{user}:{MASK}" if colon else MASK) + url[at:])


def _userinfo_end(url: str, start: int) -> int | None:
    """Where the userinfo of ``url`` (its authority starting at ``start``) ends: its last "@" followed by
    a host. None without one, or when the authority is empty (``sqlite:////path``)."""
    if url.startswith("/", start):
        return None
    ats = [m.start() for m in re.finditer("@", url) if m.start() >= start]
    return next((at for at in reversed(ats) if _HOST.match(url, at + 1)), None)


def _mask_query(url: str) -> str:
    q = url.find("?")
    if q < 0:
        return url
    query = _QUERY_PAIR.sub(
        lambda m: f"{m.group(1)}={MASK}" if _SECRET_QUERY.search(m.group(1)) else m.group(0), url[q:]
    )
    return url[:q] + query


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


def reference_all(obj, env_name: str):
    """:func:`reference` applied to every string in nested dicts and lists, each under an environment
    variable named by its key path: ``{"tracking": {"uri": ...}}`` with ``DYNATUNE`` ->
    ``DYNATUNE_TRACKING_URI``."""
    if isinstance(obj, dict):
        return {k: reference_all(v, f"{env_name}_{_env_word(k)}") for k, v in obj.items()}
    if isinstance(obj, list):
        return [reference_all(v, f"{env_name}_{i}") for i, v in enumerate(obj)]
    return reference(obj, env_name)


def resolve_all(obj, key: str = "", _stack: tuple = ()):
    """:func:`resolve` applied to every string in nested dicts and lists (a copy; a structure that contains
    itself is left to the validation that reports it)."""
    if id(obj) in _stack:
        return obj
    if isinstance(obj, dict):
        stack = (*_stack, id(obj))
        return {k: resolve_all(v, f"{key}.{k}" if key else str(k), stack) for k, v in obj.items()}
    if isinstance(obj, list):
        stack = (*_stack, id(obj))
        return [resolve_all(v, f"{key}[{i}]", stack) for i, v in enumerate(obj)]
    return resolve(obj, key or "setting")


def _env_word(key) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", str(key)).upper()


def mask_log_records() -> None:
    """From now on, every log record of this process is masked when it is made: its message (arguments
    filled in) and its traceback. Idempotent."""
    make = logging.getLogRecordFactory()
    if getattr(make, "masks_secrets", False):
        return

    def masked_record(*args, **kwargs):
        record = make(*args, **kwargs)
        try:
            record.msg, record.args = mask_text(record.getMessage()), ()
        except Exception:  # noqa: BLE001 - a message that does not format: left to logging to report
            return record
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = mask_text(logging.Formatter().formatException(record.exc_info))
        return record

    masked_record.masks_secrets = True
    logging.setLogRecordFactory(masked_record)
