"""Storage options (what configures an fsspec filesystem: endpoint, key, secret, ...) as typed on
the command line, and kept secret.

``parse_storage_options`` turns repeated ``--storage-option KEY=VALUE`` into the dict fsspec
takes; ``redact`` and ``secrets_hidden`` keep secret values out of every message; ``options_for``
and ``command_line`` are the command line's uses of them. Options are never written anywhere:
not into a cache, a manifest, a record of a build or a benchmark.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from urllib.parse import urlsplit

from ..errors import CachekitError, UsageError, hide_userinfo

__all__ = [
    "parse_storage_options",
    "check_endpoints",
    "redact",
    "redact_pairs",
    "secrets_hidden",
    "options_for",
    "command_line",
]

#: Words that make an option's key secret: its value is hidden in every message.
_SECRET_WORDS = ("secret", "token", "password", "passwd", "key", "credential", "sas", "signature", "auth")
#: ``scheme://user:password@host`` in any text: the password part is hidden.
_KEY_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_FLOAT = re.compile(r"-?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?|-?[0-9]+[eE][-+]?[0-9]+")
_HIDDEN = "***"


#: Keys whose values are always text, whatever they look like (``key=1`` is the key "1"):
#: credentials, names and endpoints, by name or by the end of their name.
_TEXT_KEYS = ("key", "secret", "token", "password", "passwd", "endpoint_url", "profile", "region_name")
_TEXT_ENDINGS = ("_key", "_key_id", "_secret", "_token", "_password", "_id", "_name", "_url", "user")


def _is_text_key(key: str) -> bool:
    last = key.rsplit(".", 1)[-1].lower()
    return last in _TEXT_KEYS or last.endswith(_TEXT_ENDINGS)


def _value(text: str, key: str):
    """A ``--storage-option`` value: JSON-ish scalars, JSON objects and lists, else the text itself.
    Credentials, names and endpoints (``_is_text_key``) are always text: as given, or a quoted
    JSON string's text."""
    word = text.strip()
    if _is_text_key(key) and not word.startswith('"'):
        return text
    word = text.strip()
    low = word.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    if _INT.fullmatch(word):  # "0123" stays text: a secret or an id, not a number
        return int(word)
    if _FLOAT.fullmatch(word):
        return float(word)
    if word[:1] in '{["':
        try:
            return json.loads(word)
        except ValueError:
            raise UsageError(
                f"--storage-option {key}=...: the value is not valid JSON (quote a string that starts "
                'with {, [ or " in single quotes for the shell, e.g. key=\'"[text]"\')'
            ) from None
    return text


def parse_storage_options(pairs: Iterable[str] | None) -> dict:
    """``["endpoint_url=http://...", "anon=true", "client_kwargs.region_name=eu-west-1"]`` (the CLI's
    ``--storage-option``) as the dict fsspec takes.

    Values: ``true``/``false``, ``null``, integers and decimals become such (``0123`` stays text),
    ``{...}``, ``[...]`` and ``"..."`` are JSON (``key='"123"'`` keeps digits as text), anything
    else is the text as given. A dotted key sets a nested option (``client_kwargs.endpoint_url``,
    ``config_kwargs.retries.max_attempts``). A key given twice, or both as a value and as a table,
    is refused. No message ever shows a value: it may be a secret.
    """
    options: dict = {}
    for number, pair in enumerate(pairs or (), 1):
        key, sep, text = str(pair).partition("=")
        key = key.strip()
        if not sep or not key:  # the text itself is never shown: it may be a secret typed alone
            what = "no '='" if not sep else "no KEY before '='"
            raise UsageError(f"--storage-option number {number}: expected KEY=VALUE, got {what}")
        parts = key.split(".")
        if not all(_KEY_PART.fullmatch(p) for p in parts):
            raise UsageError(
                f"--storage-option number {number}: the key must be a name, or names joined by dots "
                "(client_kwargs.region_name)"
            )
        table = options
        for depth, part in enumerate(parts[:-1]):
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise UsageError(
                    f"--storage-option {'.'.join(parts[: depth + 1])} is given both as a value and as a table"
                )
        last = parts[-1]
        if last in table:
            what = "both as a value and as a table" if isinstance(table[last], dict) else "twice"
            raise UsageError(f"--storage-option {key} is given {what}")
        table[last] = _value(text, key)
    return options


def check_endpoints(options: dict | None, where: str = "--storage-option") -> None:
    """Refuse (UsageError) an ``endpoint_url``, at any depth, that is not an http(s) URL of a host:
    ``file:///etc`` or a number is a mistake, told in one line before any request."""
    stack = [options or {}]
    while stack:
        table = stack.pop()
        for key, value in table.items():
            if isinstance(value, dict):
                stack.append(value)
            elif key == "endpoint_url" and value is not None:
                try:
                    parts = urlsplit(value) if isinstance(value, str) else None
                    host = parts.hostname if parts is not None else None
                except ValueError:  # "http://[::1" and the like
                    parts = host = None
                if parts is None or parts.scheme not in ("http", "https") or not host:
                    shown = value if isinstance(value, str) else type(value).__name__
                    raise UsageError(
                        f"{where} endpoint_url must be an http:// or https:// URL of a host, got {shown!r}"
                    )


def _secret_values(options, secret: bool = False) -> Iterator[str]:
    """The text of every value under a secret-sounding key (any depth), and every long text in a list."""
    if isinstance(options, dict):
        for key, value in options.items():
            named = secret or any(word in str(key).lower() for word in _SECRET_WORDS)
            yield from _secret_values(value, named)
    elif isinstance(options, (list, tuple)):
        for value in options:
            yield from _secret_values(value, secret)
    elif secret and options is not None and not isinstance(options, bool):
        text = str(options)
        if len(text) >= 3:  # "1" or "no" would blank out half a message
            yield text


def redact(text: str, storage_options: dict | None = None) -> str:
    """``text`` with secret option values (``key``, ``secret``, ``token``, ``password``, ...) and the
    password of any ``scheme://user:password@`` replaced by ``***``."""
    for value in sorted(set(_secret_values(storage_options or {})), key=len, reverse=True):
        text = text.replace(value, _HIDDEN)
    return hide_userinfo(text)


@contextlib.contextmanager
def secrets_hidden(storage_options: dict | None):
    """Within it, a CachekitError's message never shows a secret of ``storage_options``: whatever
    a worker or a filesystem put in it is redacted before it leaves (same exception, same type)."""
    try:
        yield
    except CachekitError as exc:
        text = str(exc)
        clean = redact(text, storage_options)
        if clean != text:
            exc.args = (clean,)
        raise


def redact_pairs(text: str, pairs: Iterable[str] | None) -> str:
    """``redact`` for ``--storage-option`` pairs as typed: a pair that does not parse is hidden
    whole (it may be a secret, mistyped)."""
    found: dict = {}
    for i, pair in enumerate(pairs or ()):
        try:
            found[f"option{i}"] = parse_storage_options([pair])
        except CachekitError:
            found[f"secret{i}"] = str(pair)
    return redact(text, found)


def options_for(pairs: Sequence[str], *locations) -> dict:
    """The parsed ``--storage-option`` pairs of a command; refused when none of its ``locations``
    is a URL (the options would silently do nothing: a ``s3://`` forgotten?)."""
    options = parse_storage_options(pairs)
    if options and not any(loc is not None and "://" in str(loc) for loc in locations):
        raise UsageError("--storage-option applies to URLs (s3://bucket/...); this command was given none")
    return options


def command_line(argv: Sequence[str], prog: str = "cachekit") -> str:
    """The command as typed, each ``--storage-option`` value shown as ``KEY=***``: a record of a run
    (``bench --json``) must never hold a secret."""
    flag = "--storage-option"
    out, hide = [prog], False
    for arg in argv:
        if hide:
            out.append(arg.partition("=")[0] + "=" + _HIDDEN)
            hide = False
        elif arg == flag:
            out.append(arg)
            hide = True
        elif arg.startswith(flag + "="):
            out.append(f"{flag}={arg[len(flag) + 1 :].partition('=')[0]}={_HIDDEN}")
        else:
            out.append(arg)
    return " ".join(out)
