"""A job's output stream copied from a pipe to its log file, up to a size cap.

The watchdog gives the job a pipe for stdout and one for stderr and copies each to
``stdout.log``/``stderr.log`` with :class:`CappedLog` whenever :func:`select.select` says
there is data. Past ``cap_bytes`` the rest of the stream is read and dropped (the job
never blocks on a full pipe, and is never killed for writing too much), and one line
``[gpulayer: log capped at N bytes]`` is appended once. A job's output cannot fill the
state disk that every user shares.

Standard library only: the watchdog imports this module.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CappedLog"]

_CHUNK = 1 << 16
_CHUNKS_PER_PUMP = 16  # a job that writes without pause never starves the watchdog's other duties


class CappedLog:
    """Copies what is readable on ``read_fd`` (non-blocking) to ``path``, keeping at most ``cap_bytes``.

    Args:
        read_fd: the read end of the job's pipe; owned (closed) by this object.
        path: the log file (appended to; what it already holds counts against the cap).
        cap_bytes: the most of the job's output kept; None keeps all of it.
    """

    def __init__(self, read_fd: int, path: Path, cap_bytes: int | None) -> None:
        os.set_blocking(read_fd, False)
        self.fd = read_fd
        self._file = open(path, "ab")  # noqa: SIM115 (closed in close())
        self._cap = cap_bytes
        self._written = self._file.tell()
        self._last = b"\n"
        self.capped = False
        self.open = True

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
        self._file.flush()

    def close(self) -> None:
        """Copy what is left without waiting for more, then close the pipe and the file."""
        if self.open:
            self.pump(chunks=1 << 20)
        self._close_pipe()
        self._file.close()

    def _write(self, data: bytes) -> None:
        if self.capped:
            return
        if self._cap is not None and self._written + len(data) > self._cap:
            kept = data[: max(self._cap - self._written, 0)]
            if kept:
                self._file.write(kept)
                self._last = kept[-1:]
            newline = b"" if self._last == b"\n" else b"\n"
            self._file.write(newline + f"[gpulayer: log capped at {self._cap} bytes]\n".encode())
            self._written += len(kept)
            self.capped = True
            return
        self._file.write(data)
        self._written += len(data)
        self._last = data[-1:]

    def _close_pipe(self) -> None:
        if self.open:
            self.open = False
            os.close(self.fd)
