"""A job's output stream copied from a pipe to its log file, up to a size cap.

The watchdog gives the job a pipe for stdout and one for stderr and copies each to
``stdout.log``/``stderr.log`` with :class:`CappedLog` whenever :func:`~gpulayerd.runs.waiting.readable` says
there is data. A log file is created with the stream's first byte: a job that prints nothing
leaves none (readers take a missing log for an empty one), and its start makes no inode.
Past ``cap_bytes`` the rest of the stream is read and dropped (the job
never blocks on a full pipe, and is never killed for writing too much), and one line
``[gpulayer: log capped at N bytes]`` is appended once. A job's output cannot fill the
state disk that every user shares.

A log that cannot be written (the disk is full) never stops the copy, the job or the
watchdog: the output is read and dropped, and once writing works again one line
``[gpulayer: N bytes of output dropped: ...]`` marks the gap.

Standard library only: the watchdog imports this module.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

__all__ = ["CappedLog"]

_CHUNK = 1 << 16
_CHUNKS_PER_PUMP = 16  # a job that writes without pause never starves the watchdog's other duties


class CappedLog:
    """Copies what is readable on ``read_fd`` (non-blocking) to ``path``, keeping at most ``cap_bytes``.

    Args:
        read_fd: the read end of the job's pipe; owned (closed) by this object.
        path: the log file (created when the first byte arrives, mode 0600, never through a
            symlink; else appended to; what it already holds counts against the cap).
        cap_bytes: the most of the job's output kept; None keeps all of it.
    """

    def __init__(self, read_fd: int, path: Path, cap_bytes: int | None) -> None:
        os.set_blocking(read_fd, False)
        self.fd = read_fd
        self._cap = cap_bytes
        self._last = b"\n"
        self.capped = False
        self.open = True
        self.dropped = 0  # bytes not written because the file could not be written
        self._error = ""
        self._path = path
        self._file: io.FileIO | None = None
        self._written = 0

    def pump(self, chunks: int = _CHUNKS_PER_PUMP) -> None:
        """Copy what is readable now (at most ``chunks`` reads of 64 KiB); at end of stream (every
        writer gone) close the pipe."""
        for _ in range(chunks):
            if not self.open:
                break
            try:
                data = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                break
            except InterruptedError:
                continue
            if not data:
                self._close_pipe()
                break
            self._write(data)

    def close(self) -> None:
        """Copy what is left without waiting for more, then close the pipe and the file."""
        if self.open:
            self.pump(chunks=1 << 20)
        self._close_pipe()
        if self._file is not None:
            self._file.close()

    def _write(self, data: bytes) -> None:
        if self.capped:
            return
        if self._file is None:
            self._open()  # the first byte, or the file could not be created so far (a full disk)
        if self._cap is not None and self._written + len(data) > self._cap:
            kept = data[: max(self._cap - self._written, 0)]
            newline = b"" if (kept[-1:] or self._last) == b"\n" else b"\n"
            self._put(kept, newline + f"[gpulayer: log capped at {self._cap} bytes]\n".encode())
            self.capped = True
            return
        self._put(data)

    def _put(self, data: bytes, note: bytes = b"") -> None:
        """Append ``data`` (the job's bytes) then ``note`` (ours); what cannot be written is dropped and counted."""
        if self.dropped and self._file is not None:  # the first write that works again marks the gap
            newline = b"" if self._last == b"\n" else b"\n"
            gap = newline + f"[gpulayer: {self.dropped} bytes of output dropped: {self._error}]\n".encode()
            if self._all(gap) == len(gap):
                self._last, self.dropped = b"\n", 0
        if self.dropped or self._file is None:
            self.dropped += len(data)
            return
        done = self._all(data)
        self._written += done
        if done:
            self._last = data[done - 1:done]
        if done < len(data):
            self.dropped += len(data) - done
        elif note:
            self._all(note)

    def _open(self) -> None:
        """Open (create) the log file for appending; while it cannot be, the output is dropped (and counted)."""
        try:
            fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            self._file = open(fd, "ab", buffering=0)  # noqa: SIM115 (closed in close())
            self._written = self._file.tell()
        except OSError as e:
            self._file, self._written, self._error = None, 0, e.strerror or str(e)

    def _all(self, data: bytes) -> int:
        """Write ``data``; the number of bytes written (fewer when the file cannot take more)."""
        assert self._file is not None
        view = memoryview(data)
        done = 0
        while done < len(data):
            try:
                n = self._file.write(view[done:])
            except OSError as e:
                self._error = e.strerror or str(e)
                return done
            done += n or 0
        return done

    def _close_pipe(self) -> None:
        if self.open:
            self.open = False
            os.close(self.fd)

