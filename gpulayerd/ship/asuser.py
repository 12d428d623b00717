"""Tree work done as the job's user: ``python -m gpulayerd.ship.asuser OP ARGS`` (the helper), and
:func:`run_as` that starts it (or, when the daemon already is that account, does the same work in a
thread of its own).

Operations (the stream of :mod:`gpulayerd.ship.tree` on stdin or stdout):

- ``unpack ROOT``: write the stream under the existing directory ROOT (each file exactly its ``size``
  bytes; the daemon feeds contents its cache verified against their SHA-256:
  :meth:`~gpulayerd.ship.blobcache.BlobCache.open_content`, so they are not hashed a second time here);
  prints ``{"entries": N, "bytes": B}``.
- ``collect ROOT MAX_BYTES MAX_FILES PATTERN...``: the output files as a stream on stdout, then a last
  header ``{"done": true, "note": ...}``.
- ``write DIR``: create DIR (and its parents) as the user, then write the stream (outputs: no
  hashes, an existing file replaced).

A helper that fails exits 1 with one line on stderr; one that runs past the time limit is killed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import threading
from collections.abc import Callable
from typing import IO

from gpulayerd.host.filelocks import widen_pipe
from gpulayerd.ship.tree import TreeError, collect_outputs, header, write_tree

__all__ = ["AsUserError", "main", "run_as", "user_ids"]


class AsUserError(Exception):
    """The work as the user failed or timed out (the message says why)."""


def user_ids(name: str | None) -> tuple[int, int, tuple[int, ...]] | None:
    """(uid, gid, groups) to do file work as account ``name``, or None when this process already is
    that account (or cannot change to another: it is not root). Blocking (the user database).

    Raises:
        LookupError: no such account here.
    """
    if not name or os.geteuid() != 0:
        return None
    from gpulayerd.runs.account import lookup_user

    user = lookup_user(name)
    return None if user.uid == os.geteuid() else (user.uid, user.gid, user.groups)


def _do(op: str, args: list[str], src: IO[bytes], dst: IO[bytes]) -> None:
    """Operation ``op`` (see the module docstring) reading ``src`` and writing ``dst``.

    Raises:
        TreeError, OSError, ValueError: the operation failed.
    """
    if op == "unpack" and len(args) == 1:
        n, b = write_tree(args[0], src, verify=False)  # (verified where the daemon reads its cache)
        dst.write(json.dumps({"entries": n, "bytes": b}).encode())
    elif op == "collect" and len(args) >= 3:
        note = collect_outputs(args[0], args[3:], dst, max_bytes=int(args[1]), max_files=int(args[2]))
        dst.write(header({"done": True, "note": note}))
    elif op == "write" and len(args) == 1:
        os.makedirs(args[0], mode=0o755, exist_ok=True)
        write_tree(args[0], src, verify=False, replace=True)
    else:
        raise ValueError(f"usage: asuser unpack ROOT | collect ROOT MAX_BYTES MAX_FILES PATTERN... | write DIR "
                         f"(got {op!r})")


def main(argv: list[str] | None = None) -> int:
    """The helper's entry point: exit 0, or 1 with one line on stderr."""
    args = sys.argv[1:] if argv is None else argv
    os.umask(0o022)
    try:
        _do(args[0] if args else "", args[1:], sys.stdin.buffer, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    except (TreeError, OSError, ValueError) as e:
        sys.stderr.write(f"{e}\n")
        return 1
    return 0


def run_as(op: str, args: list[str], ids: tuple[int, int, tuple[int, ...]] | None, *,
           feed: Callable[[IO[bytes]], None] | None = None, timeout_s: float, max_out_bytes: int = 1 << 30) -> bytes:
    """Do ``op`` as the account ``ids`` (uid, gid, groups): in a helper started as it, or in this process
    when ``ids`` is None (the daemon is that account). ``feed`` writes the stream the operation reads.

    Blocking (call it from a thread). Returns what the operation wrote (at most ``max_out_bytes``).

    Raises:
        AsUserError: it failed (its one line), or it ran past ``timeout_s`` seconds (then it was killed).
    """
    if ids is None:
        return _in_process(op, args, feed, timeout_s)
    from gpulayerd.gpu.command import PIPE, Popen, TimeoutExpired

    uid, gid, groups = ids
    try:
        proc = Popen([sys.executable, "-m", "gpulayerd.ship.asuser", op, *args], stdin=PIPE, stdout=PIPE,
                     stderr=PIPE, cwd="/", env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONSAFEPATH": "1"},
                     user=uid, group=gid, extra_groups=list(groups), close_fds=True, start_new_session=True)
    except OSError as e:  # e.g. the interpreter is not readable by that account
        raise AsUserError(f"cannot start the {op} helper as uid {uid}: {e.strerror or e}") from e
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    widen_pipe(proc.stdin.fileno())
    stdin = proc.stdin
    failure: list[BaseException] = []

    def feeding() -> None:
        try:
            if feed is not None:
                feed(stdin)
        except (BrokenPipeError, OSError, TreeError) as e:
            failure.append(e)
        finally:
            with contextlib.suppress(OSError):
                stdin.close()

    writer = threading.Thread(target=feeding, name="asuser-feed", daemon=True)
    writer.start()
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read(max_out_bytes) if proc.stdout else b""),
                              name="asuser-read", daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout_s)
    except TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AsUserError(f"{op} as the job's user did not finish within {timeout_s:g} s") from None
    finally:
        reader.join(5.0)
        writer.join(5.0)
    err = proc.stderr.read(4096).decode("utf-8", "replace").strip()
    if code != 0:
        raise AsUserError(err.splitlines()[-1] if err else f"{op} as the job's user exited {code}")
    if failure:
        raise AsUserError(f"{op}: the stream could not be written: {failure[0]}")
    return out[0] if out else b""


def _in_process(op: str, args: list[str], feed: Callable[[IO[bytes]], None] | None, timeout_s: float) -> bytes:
    """:func:`run_as` in this process: the stream through a pipe fed by a thread."""
    r, w = os.pipe()
    widen_pipe(w)  # (1 MiB pieces: far fewer switches between the feeding thread and the writer)
    src = os.fdopen(r, "rb")
    failure: list[BaseException] = []

    def feeding() -> None:
        with os.fdopen(w, "wb") as sink:
            try:
                if feed is not None:
                    feed(sink)
            except (BrokenPipeError, OSError, TreeError) as e:
                failure.append(e)

    writer = threading.Thread(target=feeding, name="asuser-feed", daemon=True)
    writer.start()
    dst = io.BytesIO()
    try:
        _do(op, args, src, dst)
    except (TreeError, OSError, ValueError) as e:
        raise AsUserError(str(e)) from e
    finally:
        src.close()  # a feeder still writing gets a broken pipe and ends
        writer.join(timeout_s)
    if failure:
        raise AsUserError(f"{op}: the stream could not be written: {failure[0]}")
    return dst.getvalue()


if __name__ == "__main__":
    sys.exit(main())
