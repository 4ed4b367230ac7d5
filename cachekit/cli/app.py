"""The ``cachekit`` command group, its exit codes, and what every command shares: one-line errors, SIGTERM, storage options."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from functools import wraps

import click

from ..constants import (
    REMOTE_REPLY_SECONDS,
    VERSION,
)
from ..errors import CachekitError

__all__ = ["main", "EXIT_CODES"]

#: The environment variable holding a command's deadline when no ``--timeout`` is given (0: none).
TIMEOUT_ENV = "CACHEKIT_TIMEOUT"

#: The exit codes every command uses, shown at the end of ``--help``.
EXIT_CODES = """\b
Exit codes:
  0    ok
  1    a problem found in a cache or a build: a damaged shard or manifest,
       inputs skipped under --strict, a write that failed (disk full)
  2    usage: a bad option or argument, or a path that is not a cache
  130  interrupted (Ctrl-C)
  143  terminated (SIGTERM)"""


class _Terminated(KeyboardInterrupt):
    """SIGTERM (what Kubernetes, Slurm and ``kill`` send), unwound like Ctrl-C: workers stopped, lock released."""


class _DeadlinePassed(KeyboardInterrupt):
    """``--timeout`` passed: unwound like Ctrl-C, then the process ends at once (a request that
    never answers may hold a thread that a normal exit would wait for)."""


@contextlib.contextmanager
def _deadline(seconds: float):
    """While a command runs, ``seconds`` after it started (0: never) raise _DeadlinePassed in the main thread."""

    def handler(signum, frame):
        signal.setitimer(signal.ITIMER_REAL, 0)
        raise _DeadlinePassed()

    if not seconds:
        yield
        return
    try:
        previous = signal.signal(signal.SIGALRM, handler)
    except ValueError:  # not the main thread: no deadline can be kept
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, min(seconds, 1e8))  # an "inf" timeout: about three years
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _sigterm_unwinds():
    """While a command runs, SIGTERM raises _Terminated in the main thread instead of killing it outright."""

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        raise _Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def friendly(fn):
    """Print a CachekitError as one line and exit with its code, instead of a traceback.

    Ctrl-C exits 130 and SIGTERM 143 (128 + the signal), each with one line, after the command
    has stopped its workers and released its lock.
    """

    @wraps(fn)
    def wrapper(*args, **kwargs):
        timeout = kwargs.pop("timeout", None)
        try:
            if timeout is None:
                seconds = duration(os.environ.get(TIMEOUT_ENV, "").strip() or "0", TIMEOUT_ENV)
            else:
                seconds = duration(timeout, "--timeout")
            with _sigterm_unwinds(), _deadline(seconds):
                return fn(*args, **kwargs)
        except _DeadlinePassed:
            click.echo(f"error: not done within --timeout {seconds:g} s; gave up", err=True)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        except CachekitError as exc:
            from ..store.storageopts import redact_pairs

            click.echo(f"error: {redact_pairs(str(exc), kwargs.get('storage_option'))}", err=True)
            sys.exit(exc.exit_code)
        except _Terminated:
            click.echo("terminated (SIGTERM); re-run the same command to resume", err=True)
            sys.exit(128 + signal.SIGTERM)
        except KeyboardInterrupt:
            resumes = fn.__name__ in ("build_cmd", "convert_cmd")  # the others have nothing to resume
            click.echo("interrupted" + ("; re-run the same command to resume" if resumes else ""), err=True)
            sys.exit(130)

    return wrapper


def with_storage_options(fn):
    """``--storage-option KEY=VALUE`` (repeatable) and ``--timeout`` on a command that takes URLs."""
    fn = click.option(
        "--timeout",
        "timeout",
        default=None,
        metavar="DURATION",
        help="Give up (one line, exit 1) when the command is not done after this long: seconds or 30m, "
        "2h [default: CACHEKIT_TIMEOUT, else none]. Whatever it is, storage that gives no first answer "
        f"within {REMOTE_REPLY_SECONDS} s (CACHEKIT_REMOTE_TIMEOUT) is one line, exit 2.",
    )(fn)
    return click.option(
        "--storage-option",
        "storage_option",
        multiple=True,
        metavar="KEY=VALUE",
        help="fsspec option for the URLs (s3://...) this command reaches, e.g. endpoint_url=http://HOST:9000, "
        "key=..., secret=..., anon=true, client_kwargs.region_name=eu-west-1 (dots nest); repeatable. "
        "Values true/false/numbers/JSON are typed. Never written into a cache nor shown.",
    )(fn)


def options_of(pairs: tuple[str, ...], *locations) -> dict:
    from ..store.storageopts import options_for

    return options_for(pairs, *locations)


@click.group(epilog=EXIT_CODES)
@click.version_option(VERSION, prog_name="cachekit")
def main() -> None:
    """Decode and preprocess an image dataset once into a sharded cache; train from the cache."""


def duration(text: str, flag: str) -> float:
    """Seconds from ``90``, ``30s``, ``30m``, ``2h`` or ``1d``."""
    from ..errors import UsageError

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    value = text.strip().lower()
    scale = units.get(value[-1:], None)
    try:
        seconds = float(value[:-1] if scale else value) * (scale or 1)
    except ValueError:
        raise UsageError(f"{flag}: expected seconds or a duration like 30m, 2h, 1d; got {text!r}") from None
    if seconds < 0 or seconds != seconds:
        raise UsageError(f"{flag} must be >= 0")
    return seconds


def augment_spec(ctx, param, value: str | None):
    """An ``--augment`` spec parsed (never evaluated) into transforms, refused in one line."""
    if value is None:
        return None
    from ..augment.spec import parse_spec

    try:
        return parse_spec(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
