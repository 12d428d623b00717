"""``gpulayer logs``: a job's output, every rank of a multi-host job, and how the job ended.

Without ``--stderr`` the job's stdout is printed; then, when stdout was empty, its stderr
(on stderr), else one line on stderr saying how much stderr holds and how to read it. A
multi-host job's ranks are each read from the member that ran them (the owner asks it);
without ``--rank`` every rank's lines are printed with a ``[rank N] `` prefix. ``-f`` follows
the job to its end, prints while it waits why it waits (once, and again when that changes),
and ends with one line on stderr stating the outcome: exit 0 when the job succeeded, else 1.

Output to a terminal goes through :class:`gpulayerd.termsafe.TerminalText` (colours kept, every
other escape sequence and control character dropped, ``\r`` overwriting its line; a line shows
once it is complete) unless the reader is the job's user or ``--raw`` is given; piped output is
always the text as the daemon sent it.

``gpulayer fetch ID [PATH...]`` (here too: it reads what an attempt left, as ``logs`` does): the
files of a finished attempt of a shipped job, from the tree its worker keeps (``ship_keep_s``);
only the job's user (or root), through the job's owner. The CLI, as the user, writes them under
``./gpulayer-out/ID/`` (or ``--to DIR``) with :func:`gpulayerd.ship.tree.write_tree`: relative
paths only, no ``..``, no link followed, an existing file replaced; at most ``ship_outputs_mb``.
"""

from __future__ import annotations

import argparse
import os
import pwd
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from gpulayerd import text as fmt
from gpulayerd.cli.exits import EXIT_FAILURE, EXIT_OK
from gpulayerd.core.job_facts import TERMINAL_STATES
from gpulayerd.termsafe import LONG_LINE, TerminalText

if TYPE_CHECKING:
    from gpulayerd.cli.http import SyncClient
    from gpulayerd.models import JobView

__all__ = ["MAX_FETCH_BYTES", "POLL_S", "add_parser", "fetch_files", "follow_logs", "outcome", "sanitizes"]

MAX_FETCH_BYTES = 2 * 10**9
"""The most bytes one ``gpulayer fetch`` takes (the worker caps it at ``ship_outputs_mb`` before)."""

POLL_S = 0.3
"""Seconds between reads while following a job that has nothing new."""

_TERMINAL = TERMINAL_STATES


@dataclass
class _Tail:
    """What has been read of one rank's log (``rank`` None: a one-host job)."""

    rank: int | None
    prefix: str
    safe: TerminalText | None = None
    offset: int = 0
    attempt: int | None = None
    printed: int = 0
    partial: str = ""

    def emit(self, data: str, out: TextIO) -> None:
        """Write ``data``: as is, or line by line after the prefix (a cut line waits for its end);
        with :attr:`safe`, only whole sanitized lines."""
        self.printed += len(data)
        if self.safe is not None:
            lines = self.safe.feed(data)
            if self.safe.width >= LONG_LINE:
                lines.append(self.safe.wrap())  # as the terminal wraps it: never the whole of an endless line held
            out.write("".join(f"{self.prefix}{line}\n" for line in lines))
        elif not self.prefix:
            out.write(data)
        else:
            *lines, self.partial = (self.partial + data).split("\n")
            out.write("".join(f"{self.prefix}{line}\n" for line in lines))
        out.flush()

    def flush(self, out: TextIO) -> None:
        """Write a last line that has no newline (without a prefix: as it is, without one)."""
        if self.safe is not None:
            self.partial = self.safe.end()
        if self.partial:
            out.write(f"{self.prefix}{self.partial}\n" if self.prefix else self.partial)
            out.flush()
            self.partial = ""


def sanitizes(out: TextIO, job: JobView, raw: bool) -> bool:
    """Whether job output written to ``out`` goes through the sanitizer: ``out`` is a terminal, the
    reader (this process's user) is not the job's user, and ``--raw`` was not given."""
    if raw or not out.isatty():
        return False
    try:
        reader = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        reader = str(os.getuid())  # an account without a name is nobody's job user
    return job.submitted_by != reader


def outcome(job: JobView) -> str:
    """How a finished job ended, in one line: "job X succeeded", "job X failed: exited 3", "job X failed:
    could not start: command not found: trian.py (exit 127)", ..."""
    if job.status == "succeeded":
        return f"job {job.id} succeeded"
    why = fmt.escape(fmt.one_line(job.reason, 300))  # the reason may quote a job's or a peer's text
    if job.status == "failed" and job.exit_code is not None and job.exit_code >= 0:
        if job.reason.startswith("could not start"):  # the recorded start failure, then its exit code
            return f"job {job.id} failed: {why} (exit {job.exit_code})"
        return f"job {job.id} failed: exited {job.exit_code}"
    return f"job {job.id} {job.status}" + (f": {why}" if why else "")


def _ranks(job: JobView, attempt: int | None, rank: int | None) -> list[int | None]:
    """The ranks to read: ``[rank]`` when asked, every rank of a multi-host attempt, else ``[None]``."""
    if rank is not None:
        return [rank]
    n = attempt if attempt is not None else job.attempt
    tried = next((a for a in job.attempts if a.attempt == n), None)
    if tried is not None and len(tried.gang) > 1:
        return list(range(len(tried.gang)))
    return [None]


def _tails(ranks: list[int | None], asked: int | None, safe: bool = False) -> list[_Tail]:
    many = asked is None and len(ranks) > 1
    return [_Tail(r, f"[rank {r}] " if many else "", TerminalText() if safe else None) for r in ranks]


def _drain(c: SyncClient, job_id: str, t: _Tail, stream: str, attempt: int | None, out: TextIO) -> bool:
    """Print what is new in ``t``'s log; True when the log is complete (the attempt ended)."""
    while True:
        chunk = c.logs(job_id, stream=stream, offset=t.offset, attempt=attempt, rank=t.rank)
        if t.attempt is not None and chunk.attempt != t.attempt:
            # A new attempt (a retry) began: its log starts at byte 0.
            t.flush(out)
            t.attempt, t.offset = chunk.attempt, 0
            continue
        t.attempt = chunk.attempt
        if chunk.data:
            t.emit(chunk.data, out)
            t.offset = chunk.next_offset
            continue
        return bool(chunk.complete)


def _stderr_note(c: SyncClient, job: JobView, t: _Tail, args: argparse.Namespace) -> None:
    """After a rank's stdout: its stderr when stdout was empty, else how many bytes stderr holds."""
    if t.printed == 0:
        err = _Tail(t.rank, t.prefix, TerminalText() if sanitizes(sys.stderr, job, args.raw) else None)
        _drain(c, job.id, err, "stderr", args.attempt, sys.stderr)
        err.flush(sys.stderr)
        return
    chunk = c.logs(job.id, stream="stderr", offset=0, attempt=args.attempt, rank=t.rank)
    size = chunk.size if chunk.size is not None else len(chunk.data.encode())
    if size <= 0:
        return
    flags = "--stderr" + (f" --rank {t.rank}" if t.rank is not None else "") + (
        f" --attempt {args.attempt}" if args.attempt is not None else "")
    who = f"rank {t.rank} stderr" if t.rank is not None and t.prefix else "stderr"
    print(f"({who}: {fmt.size(size)}: gpulayer logs {flags} {job.id})", file=sys.stderr)


def follow_logs(c: SyncClient, args: argparse.Namespace) -> int:
    """``gpulayer logs``: print the log(s) of ``args.job``; with ``args.follow`` until the job ends.

    Returns:
        0, or with ``-f`` 0 when the job succeeded and 1 when it ended otherwise.
    """
    job = c.job(args.job)
    if job.array is not None:  # the array's own row runs nothing: its output is in its tasks' logs
        print(f"job {job.id} is an array: it has no output of its own; a task's is gpulayer logs {job.id}_N "
              "(gpulayer jobs --tasks lists them)", file=sys.stderr)
    stream = "stderr" if args.stderr else "stdout"
    safe = sanitizes(sys.stdout, job, args.raw)
    tails = _tails(_ranks(job, args.attempt, args.rank), args.rank, safe)
    waited = ""
    while True:
        complete = True
        for t in tails:
            complete = _drain(c, job.id, t, stream, args.attempt, sys.stdout) and complete
        if not args.follow:
            break
        ended = job.status in _TERMINAL
        if complete and (ended or args.attempt is not None):
            break
        if ended:
            break  # the job ended and every log was read once more after it
        time.sleep(POLL_S)
        job = c.job(job.id)
        if job.status == "queued" and job.reason and job.reason != waited:
            waited = job.reason
            print(f"job {job.id} {job.status}: {fmt.escape(fmt.one_line(job.reason, 300))}", file=sys.stderr)
        ranks = _ranks(job, args.attempt, args.rank)
        if ranks != [t.rank for t in tails]:
            for t in tails:
                t.flush(sys.stdout)
            tails = _tails(ranks, args.rank, safe)  # it started on several hosts (or on other ones)
    for t in tails:
        t.flush(sys.stdout)
    if stream == "stdout":
        for t in tails:
            _stderr_note(c, job, t, args)
    if not args.follow:
        return EXIT_OK
    if job.status not in _TERMINAL:
        return EXIT_OK  # an earlier attempt's log, read to its end
    print(outcome(job), file=sys.stderr)
    return EXIT_OK if job.status == "succeeded" else EXIT_FAILURE


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``gpulayer fetch``."""
    f = sub.add_parser("fetch", help="files of a finished attempt of a shipped job, from the worker that ran it",
                       description="Get files of a finished attempt of a shipped job (--ship) from the tree its "
                       "worker keeps (ship_keep_s, default a day). Only the job's user (or root) may, on the "
                       "machine that owns the job. Files are written as you under ./gpulayer-out/ID/ (or --to "
                       "DIR), links never followed; paths are relative to the job's tree.")
    f.add_argument("job", metavar="ID", help="the job's id")
    f.add_argument("paths", nargs="*", metavar="PATH", help="globs relative to the job's tree (default: every file)")
    f.add_argument("--attempt", type=int, metavar="N", help="an earlier attempt (default: the latest)")
    f.add_argument("--to", metavar="DIR", help="write the files under DIR (default: ./gpulayer-out/ID/)")
    f.set_defaults(func=_cmd_fetch)


def fetch_files(client: SyncClient, job: str, paths: list[str], attempt: int | None) -> tuple[bytes, int, str]:
    """The stream of the files (see :mod:`gpulayerd.ship.tree`), the attempt and its worker.

    Raises:
        CommandFailed: the daemon refused, or more than :data:`MAX_FETCH_BYTES`.
    """
    import base64

    from gpulayerd.cli.exits import CommandFailed

    parts: list[bytes] = []
    offset = 0
    while True:
        chunk = client.fetch(job, paths, offset, attempt)
        data = base64.b64decode(chunk.data)
        if chunk.offset != offset or chunk.total > MAX_FETCH_BYTES:
            raise CommandFailed(f"fetch: a malformed or oversized answer ({chunk.total} bytes)")
        parts.append(data)
        offset += len(data)
        attempt = int(chunk.attempt)
        if offset >= chunk.total or not data:
            return b"".join(parts), attempt, str(chunk.worker)


def _cmd_fetch(args: argparse.Namespace) -> int:
    import io
    from pathlib import Path

    from gpulayerd.cli.exits import CommandFailed, UsageError
    from gpulayerd.cli.http import call_daemon
    from gpulayerd.core.shipping import glob_problem
    from gpulayerd.ship.tree import TreeError, read_entries, write_tree

    for pattern in args.paths:
        problem = glob_problem(pattern)
        if problem is not None:
            raise UsageError(f"fetch: {problem}")
    raw, attempt, _ = call_daemon(args, lambda c: fetch_files(c, args.job, list(args.paths), args.attempt))
    dest = Path(args.to) if args.to else Path.cwd() / "gpulayer-out" / args.job
    dest.mkdir(parents=True, exist_ok=True)
    note = ""
    try:
        n, size = write_tree(str(dest), io.BytesIO(raw), verify=False, replace=True)  # (up to the trailer)
        src = io.BytesIO(raw)
        for entry, read in read_entries(src):  # the trailer's note: what the worker left out over its caps
            if entry.get("done"):
                note = str(entry.get("note", ""))
                break
            read(int(entry.get("size", 0)) if entry.get("kind") == "file" else 0)
    except (TreeError, OSError, ValueError) as e:
        raise CommandFailed(f"fetch: {e}") from None
    print(f"fetched {n} file(s) ({size / 1e6:.1f} MB) of attempt {attempt} into {fmt.escape(str(dest))}")
    if note:
        print(f"note: {fmt.escape(note)}", file=sys.stderr)
    if not n:
        what = ", ".join(fmt.escape(p) for p in args.paths) if args.paths else "every file"
        print(f"gpulayer: fetch: no file of attempt {attempt} matched {what} (globs as a shell's: '*' stays in one "
              "directory, '**' crosses them, a directory stands for its files)", file=sys.stderr)
    return EXIT_OK if n else EXIT_FAILURE
