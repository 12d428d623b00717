"""A pre-forked watchdog parent: job starts without a Python start-up per job.

The daemon starts one zygote (``python -m gpulayerd.runs.zygote RUNS_DIR FD``) that imports
:mod:`gpulayerd.runs.watchdog` once and then waits on its control channel, a
``SOCK_SEQPACKET`` socketpair inherited from the daemon (no path anybody could connect to).
It has no threads and no event loop: a plain blocking loop, so forking it is safe. Each
request's child, in a session of its own, becomes that attempt's watchdog
(:func:`gpulayerd.runs.watchdog.supervise`): same files, same deadline, device locks, exit
record, log caps, run-as-user checks, same re-adoption after a daemon restart. The child is
forked ahead: the zygote keeps two *spares* (:data:`SPARES`, one forked again once the requests pause, off
the start's path, :data:`FORK_AFTER_S`; at once when none is left) that
has detached, become a child subreaper and read its own process record, and waits on a
socketpair of its own; a checked start is handed to it (the run directory's path and the
descriptors). The zygote forks at the start only when the spare cannot take it (it died). A
spare whose zygote exits sees end-of-file and exits without starting anything.

A request is one datagram: JSON ``{"job_id", "attempt", "locks": N}`` with ``1 + N``
descriptors (SCM_RIGHTS): a *notify* pipe's write end, then the device lock descriptors.
Before it starts anything the zygote checks:

- the sender's credentials (SCM_CREDENTIALS, filled in by the kernel): its uid must be the
  zygote's own effective uid (root in system mode); anybody else is refused;
- the run directory, built here from the job id and attempt under the runs root it was
  started with (:func:`gpulayerd.runs.layout.run_dir`): the runs root, ``JOB`` and
  ``JOB/ATTEMPT`` must be real directories (not symlinks) owned by the zygote's uid,
  the last two mode 0700, and ``launch.json`` a regular file owned by that uid.

The reply is JSON ``{"ok": true, "pid": P}`` or ``{"ok": false, "error": "..."}``.

The notify pipe makes a lost start impossible to miss: every holder of its write end (the
daemon until it sent it, the datagram in flight, the zygote, the watchdog until it wrote
``job.json`` or ``exit.json``) closes it, so end-of-file on the read end with no claim
(``watchdog.json``) in the run directory means no watchdog has started there and none ever
will: the daemon may start the attempt another way without running it twice
(:class:`ZygoteLaunch.lost`).

The zygote exits when the daemon's end closes (the daemon stopped or was killed), or when its
parent is no longer the daemon (checked every 2 s, should another process keep the daemon's end
open); a start it is handing over is finished first. Its spares die with it (the kernel's
parent-death signal until a spare takes a start, and a check of the parent as a backstop): no
spare outlives its zygote. Its watchdogs go on: they outlive the zygote and the daemon by
design, to hold their jobs' deadlines. A zygote that died is started again on the next launch
(:meth:`Zygote.launch`). In ``ps -o comm`` the three are ``gpulayer-zygote``,
``gpulayer-spare`` and ``gpulayer-wd``.
"""

from __future__ import annotations

import array
import contextlib
import gc
import io
import json
import logging
import os
import pwd
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpulayerd.gpu.command import DEVNULL, Popen, TimeoutExpired
from gpulayerd.runs import layout, watchdog
from gpulayerd.runs.launchfile import LaunchFile
from gpulayerd.runs.waiting import die_with_parent, name_process, orphaned, readable

__all__ = ["Zygote", "ZygoteLaunch", "ZygoteRefused", "check_run_dir", "main"]

log = logging.getLogger(__name__)

_MAX_FDS = 64
_WATCHDOG_LINE = "%(asctime)s watchdog[%(process)d] %(levelname)s %(message)s"
_WATCHDOG_FORMAT = logging.Formatter(_WATCHDOG_LINE)
"""A forked watchdog's log format, made before any fork (making it in each child copies pages)."""
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_REPLY_TIMEOUT_S = 5.0
SPARES = 2
"""Spare watchdogs kept forked ahead (two starts in a row take one each, none waits for a fork)."""
FORK_AFTER_S = 0.005
"""A used spare is forked again once the control socket was quiet this long (s): a fork copies the
zygote's page tables, CPU that a trivial job's start, just handed to a spare, needs more."""
_PARENT_CHECK_S = 2.0
"""How often the zygote and a spare check that their parent is still there (seconds)."""


class ZygoteRefused(Exception):
    """The zygote refused a request (wrong sender, unsafe run directory); nothing was started."""


# --------------------------------------------------------------------------- daemon side


class ZygoteLaunch:
    """One start handed to the zygote: watches its notify pipe (closed once the watchdog
    wrote ``job.json`` or ``exit.json``, or when no watchdog can start any more).

    Args:
        notify_fd: the read end of the notify pipe (owned: closed by :meth:`close`).
        run_dir: the attempt's run directory.
    """

    def __init__(self, notify_fd: int, run_dir: Path) -> None:
        self._fd: int | None = notify_fd
        self._run_dir = run_dir
        self._eof = False

    def pause(self, timeout_s: float = 0.05) -> None:
        """Wait up to ``timeout_s`` for the notify pipe's end (or just sleep once it ended)."""
        if self._fd is None:
            time.sleep(timeout_s)
            return
        if readable([self._fd], timeout_s) and not os.read(self._fd, 64):
            self._eof = True
            self.close()

    def poll(self) -> int | None:
        """0 once every holder of the notify pipe closed it, else None (like ``Popen.poll``)."""
        return 0 if self._eof else None

    def lost(self) -> bool:
        """True if no watchdog started and none ever will (pipe ended, no claim): start it again."""
        return self._eof and not (self._run_dir / layout.WATCHDOG_FILE).exists()

    def close(self) -> None:
        """Close the notify pipe's read end."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> ZygoteLaunch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Zygote:
    """The daemon's end of the zygote: starts it (again when it died) and hands it starts.

    Thread-safe (one request at a time); every method blocks briefly: call from a worker
    thread, never on the event loop.

    Args:
        runs_dir: the runs root (``runs_dir/JOB/ATTEMPT``).
        python: the interpreter that runs the zygote.
        env: the zygote's environment (gpulayerd importable).
    """

    def __init__(self, runs_dir: Path, python: str, env: Mapping[str, str]) -> None:
        self._runs_dir = Path(runs_dir)
        self._python = python
        self._env = dict(env)
        self._lock = threading.Lock()
        self._proc: Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self.starts = 0
        """How many zygote processes were started (a restart after a death counts)."""

    @property
    def pid(self) -> int | None:
        """The running zygote's pid, or None."""
        return None if self._proc is None else self._proc.pid

    def start(self) -> bool:
        """Start the zygote unless it runs; False if it cannot be started (logged)."""
        with self._lock:
            return self._ensure()

    def launch(self, job_id: str, attempt: int, lock_fds: Sequence[int]) -> ZygoteLaunch | None:
        """Ask the zygote to start the attempt's watchdog (``launch.json`` must be written).

        Returns:
            The launch to wait on (see :class:`ZygoteLaunch`), or None when no zygote can
            take it (it cannot be started): start a per-job watchdog instead.

        Raises:
            ZygoteRefused: the zygote refused (an unsafe run directory, a wrong sender).
        """
        run_dir = layout.run_dir(self._runs_dir, job_id, attempt)
        request = json.dumps({"job_id": job_id, "attempt": attempt, "locks": len(lock_fds)}).encode()
        with self._lock:
            for _ in range(2):  # a zygote found dead is started again once
                if not self._ensure():
                    return None
                assert self._sock is not None
                read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
                try:
                    fds = array.array("i", [write_fd, *lock_fds])
                    self._sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                except OSError as e:  # not delivered: nothing can have started
                    os.close(read_fd)
                    log.warning("the zygote (pid %s) does not take requests (%s): starting it again", self.pid, e)
                    self._drop()
                    continue
                finally:
                    os.close(write_fd)
                try:
                    raw = self._sock.recv(4096)
                except OSError:
                    raw = b""
                if not raw:  # it died after it got the request: the notify pipe tells what happened
                    log.warning("the zygote (pid %s) died during a start", self.pid)
                    self._drop()
                    return ZygoteLaunch(read_fd, run_dir)
                reply = json.loads(raw)
                if not reply.get("ok"):
                    os.close(read_fd)
                    raise ZygoteRefused(str(reply.get("error", "refused")))
                return ZygoteLaunch(read_fd, run_dir)
        return None

    def close(self) -> None:
        """Stop the zygote (its watchdogs go on)."""
        with self._lock:
            self._drop()

    def _ensure(self) -> bool:
        if self._proc is not None and self._proc.poll() is None and self._sock is not None:
            return True
        self._drop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = Popen(
                [self._python, "-m", "gpulayerd.runs.zygote", str(self._runs_dir), str(theirs.fileno())],
                env=self._env, stdin=DEVNULL, stdout=DEVNULL,
                start_new_session=True, pass_fds=(theirs.fileno(),),
            )
        except OSError as e:
            log.error("cannot start the zygote with %s: %s", self._python, e)
            ours.close()
            return False
        finally:
            theirs.close()
        ours.settimeout(_REPLY_TIMEOUT_S)
        # The kernel attaches our credentials to every datagram (the zygote checks them).
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._sock = ours
        self.starts += 1
        try:
            hello = ours.recv(4096)  # sent once its imports are done
        except OSError:
            hello = b""
        if not hello:
            log.error("the zygote (pid %s) did not start", self.pid)
            self._drop()
            return False
        return True

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        proc, self._proc = self._proc, None
        if sock is not None:
            sock.close()  # the zygote sees end-of-file and exits
        if proc is not None:
            try:
                proc.wait(timeout=2.0)
            except TimeoutExpired:
                proc.kill()
                proc.wait()


# --------------------------------------------------------------------------- zygote side


def check_run_dir(runs_root: Path, job_id: str, attempt: int, uid: int) -> Path:
    """The run directory of ``job_id``/``attempt`` under ``runs_root``, if it is safe to start in.

    Raises:
        ZygoteRefused: a bad job id or attempt; the runs root, ``JOB`` or ``JOB/ATTEMPT`` is
            missing, a symlink, not a directory, not owned by ``uid``, or (the last two) not
            mode 0700; ``launch.json`` is not a regular file owned by ``uid``.
    """
    try:
        run_dir = layout.run_dir(runs_root, job_id, attempt)
    except (ValueError, TypeError) as e:
        raise ZygoteRefused(str(e)) from None
    for path, private in ((runs_root, False), (run_dir.parent, True), (run_dir, True)):
        try:
            st = os.lstat(path)
        except OSError as e:
            raise ZygoteRefused(f"{path}: {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise ZygoteRefused(f"{path} is not a directory (a symlink?)")
        if st.st_uid != uid:
            raise ZygoteRefused(f"{path} is owned by uid {st.st_uid}, not {uid}")
        if st.st_mode & (0o077 if private else 0o022):
            raise ZygoteRefused(f"{path} has mode {stat.S_IMODE(st.st_mode):o}")
    try:
        st = os.lstat(run_dir / layout.LAUNCH_FILE)
    except OSError as e:
        raise ZygoteRefused(f"{run_dir / layout.LAUNCH_FILE}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
        raise ZygoteRefused(f"{run_dir / layout.LAUNCH_FILE} is not a regular file of uid {uid}")
    return run_dir


def main(argv: Sequence[str] | None = None) -> int:
    """Serve start requests on the inherited socket until the daemon closes it.

    Returns:
        0 when the daemon's end closed; 2 for a usage error or a peer of another uid.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or not args[1].isdigit():
        print("usage: python -m gpulayerd.runs.zygote RUNS_DIR FD", file=sys.stderr)
        return 2
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s zygote[%(process)d] %(levelname)s %(message)s")
    runs_root = Path(args[0]).resolve()
    sock = socket.socket(fileno=int(args[1]))
    uid = os.geteuid()
    peer_uid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))[1]
    if peer_uid != uid:
        log.error("the control socket's peer is uid %d, not %d: refusing to serve", peer_uid, uid)
        return 2
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    daemon = os.getppid()
    name_process("gpulayer-zygote")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the daemon's terminal is the daemon's
    # Its children (the watchdogs) are reaped by the kernel: no zombies, no wait, one fork per start.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    # Everything imported so far moves to the collector's permanent generation: a collection in a
    # forked watchdog never walks (and so never copies) the zygote's pages.
    watchdog.preload()
    gc.collect()
    gc.freeze()
    sock.send(json.dumps({"ready": os.getpid()}).encode())
    spares: list[_Spare] = []
    for _ in range(SPARES):
        _add_spare(sock, spares)
    # The daemon's end closing (it stopped or was killed) ends the zygote; so does the daemon's exit
    # seen as a new parent, should its end stay open in some other process. A start in progress is
    # finished first: requests are only read between starts. A spare used is forked again once no
    # request came for FORK_AFTER_S (not while the start it took runs on the same CPUs).
    fork_failed = False  # (then the next try waits _PARENT_CHECK_S, not FORK_AFTER_S)
    while True:
        sock.settimeout(FORK_AFTER_S if len(spares) < SPARES and not fork_failed else _PARENT_CHECK_S)
        try:
            msg, ancdata, _, _ = sock.recvmsg(
                65536, socket.CMSG_SPACE(_MAX_FDS * 4) + socket.CMSG_SPACE(_CRED.size))
        except TimeoutError:
            if orphaned(daemon):
                log.info("the daemon (pid %d) is gone: exiting", daemon)
                return 0
            if len(spares) < SPARES:
                fork_failed = not _add_spare(sock, spares)
            continue
        except ConnectionResetError:
            return 0
        if not msg:
            return 0
        fds, sender = _unpack(ancdata)
        try:
            reply: dict[str, object] = {"ok": True, "pid": _serve(sock, runs_root, uid, msg, fds, sender, spares)}
            if spares:
                spares.pop(0)  # used (or dead): a refused request leaves it waiting
        except ZygoteRefused as e:
            log.warning("refused a start: %s", e)
            reply = {"ok": False, "error": str(e)}
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        with contextlib.suppress(OSError):
            sock.send(json.dumps(reply).encode())
        fork_failed = False
        if not spares:  # none left for the next start: forked now, after the reply
            _add_spare(sock, spares)


def _unpack(ancdata: list[tuple[int, int, bytes]]) -> tuple[list[int], int | None]:
    """(descriptors received, the sender's uid) from a datagram's ancillary data."""
    fds: list[int] = []
    sender: int | None = None
    for level, kind, data in ancdata:
        if level != socket.SOL_SOCKET:
            continue
        if kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(data[: len(data) - len(data) % arr.itemsize])
            fds.extend(arr)
        elif kind == socket.SCM_CREDENTIALS and len(data) >= _CRED.size:
            sender = _CRED.unpack(data[: _CRED.size])[1]
    return fds, sender


class _Spare:
    """A watchdog forked ahead of the next start, waiting on ``link`` for its run directory."""

    def __init__(self, pid: int, link: socket.socket) -> None:
        self.pid = pid
        self.link = link

    def hand_over(self, run_dir: Path, fds: list[int]) -> bool:
        """Give it the start (the path and the descriptors); False if it cannot take it (it died)."""
        try:
            self.link.sendmsg([os.fsencode(run_dir)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        except OSError as e:
            log.warning("the spare watchdog (pid %d) cannot take a start (%s): forking one", self.pid, e)
            return False
        finally:
            self.link.close()
        return True


def _serve(sock: socket.socket, runs_root: Path, uid: int, msg: bytes, fds: list[int], sender: int | None,
           spares: Sequence[_Spare]) -> int:
    """Check one request and hand it to the first spare watchdog (or fork one if it cannot take it); the
    watchdog's pid. Once the request passed its checks, that spare is used up either way."""
    if sender != uid:
        raise ZygoteRefused(f"a request from uid {sender} (only uid {uid} may start jobs here)")
    try:
        request = json.loads(msg)
        job_id, attempt, locks = request["job_id"], request["attempt"], request["locks"]
    except (ValueError, KeyError, TypeError):
        raise ZygoteRefused("a request that is not {job_id, attempt, locks}") from None
    if not isinstance(attempt, int) or not isinstance(locks, int) or len(fds) != 1 + locks:
        raise ZygoteRefused(f"a request with {len(fds)} descriptors for {locks} locks")
    run_dir = check_run_dir(runs_root, job_id, attempt, uid)
    if spares and spares[0].hand_over(run_dir, fds):
        return spares[0].pid
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _drop_links(spares)
        _detach(sock)
        _become_watchdog(run_dir, fds)  # never returns
    return pid


def _drop_links(spares: Sequence[_Spare]) -> None:
    """In a forked child: close the zygote's ends of the spares' links (only the zygote may hold them, so
    that a spare sees end-of-file when the zygote exits)."""
    for other in spares:
        with contextlib.suppress(OSError):
            other.link.close()


def _add_spare(sock: socket.socket, spares: list[_Spare]) -> bool:
    """Fork one more spare into ``spares``; False when it could not be forked (logged)."""
    spare = _fork_spare(sock, spares)
    spares.extend([spare] if spare is not None else [])
    return spare is not None


def _fork_spare(sock: socket.socket, spares: Sequence[_Spare] = ()) -> _Spare | None:
    """Fork the next start's watchdog now: it detaches and waits, so a start costs no fork (``spares``: the
    others, whose links the child closes)."""
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    except OSError as e:  # out of descriptors: the next start forks its watchdog then
        log.warning("cannot make a spare watchdog's socket: %s", e)
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as e:
        log.warning("cannot fork a spare watchdog: %s", e)
        ours.close()
        theirs.close()
        return None
    if pid == 0:
        ours.close()
        _drop_links(spares)
        _spare(sock, theirs)  # never returns
    theirs.close()
    return _Spare(pid, ours)


def _spare(sock: socket.socket, link: socket.socket) -> None:
    """The spare child: detach, wait for a run directory and its descriptors, become its watchdog.

    It never outlives the zygote without a start: end-of-file on ``link`` (the zygote exited) ends
    it, and so does the zygote's exit itself (the kernel's parent-death signal, SIGKILL, until it
    takes a start; a check of its parent's pid as a backstop).
    """
    code = 1
    zygote = os.getppid()
    try:
        die_with_parent(signal.SIGKILL)
        if orphaned(zygote):  # it died before the parent-death signal was set
            code = 0
            return
        _detach(sock)
        name_process("gpulayer-spare")
        watchdog.prepare()
        _warm_up()
        link.settimeout(_PARENT_CHECK_S)
        while True:
            try:
                msg, ancdata, _, _ = link.recvmsg(4096, socket.CMSG_SPACE(_MAX_FDS * 4))
                break
            except TimeoutError:
                if orphaned(zygote):
                    code = 0
                    return
        die_with_parent(None)  # a watchdog outlives the zygote and the daemon: that is what it is for
        fds, _ = _unpack(ancdata)
        link.close()
        if not msg:
            code = 0
            return
        _become_watchdog(Path(os.fsdecode(msg)), fds)  # never returns
    except BaseException:
        with contextlib.suppress(BaseException):
            log.exception("spare watchdog failed")
    finally:
        os._exit(code)


def _warm_up() -> None:
    """In a spare, before it waits: run once, on sample data, what a start runs in Python (the launch
    file's checks, JSON, the account lookup's first use of the C library's user database, file reads and
    writes). Each page of the zygote's memory those touch is copied (copy-on-write) now, not during the
    start: about 200 page faults fewer there, a millisecond of a trivial job's start on a small VM.
    Nothing is written but to ``/dev/null``; a failure only costs those faults later."""
    with contextlib.suppress(Exception):
        sample = {"v": 1, "job_id": "warm-up", "attempt": 1, "argv": ["true"], "env": dict(os.environ), "cwd": "/",
                  "grace_s": 1.0, "poll_interval_s": 1.0, "kill_timeout_s": 1.0, "lock_fds": [], "user": None,
                  "log_cap_bytes": 1, "deadline": 1.0, "renew_s": 1.0, "time_limit_s": None, "warn_signal": None,
                  "warn_at_s": None, "preflight": None}
        LaunchFile.parse(json.loads(json.dumps(sample, sort_keys=True)), Path("warm-up"))
        pwd.getpwuid(os.getuid())
        layout.read_json(Path(f"/proc/{os.getpid()}/stat"))
        with os.fdopen(os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC), "wb") as null:
            null.write((json.dumps({"pid": 1, "started_at": time.time()}, sort_keys=True) + "\n").encode())


def _detach(sock: socket.socket) -> None:
    """In a forked child: a session of its own, default signals, standard streams to /dev/null (it
    never holds the daemon's, and outlives it), no log handler yet. What Python writes to stderr
    itself (a fatal error, a log record that cannot be written) is lost; the watchdog's own
    records go to ``watchdog.log``."""
    sock.close()  # the zygote's death must reach the daemon as end-of-file
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)


def _become_watchdog(run_dir: Path, fds: list[int]) -> None:
    """Be the attempt's watchdog (``fds``: the notify pipe, then the device locks), then exit.

    Its log is ``watchdog.log``, created with the first line (a normal start and end log none).
    """
    code = 1
    try:
        os.chdir(run_dir)
        name_process("gpulayer-wd")
        root = logging.getLogger()
        handler = _LazyLog(run_dir / layout.WATCHDOG_LOG)
        handler.setFormatter(_WATCHDOG_FORMAT)
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        code = watchdog.supervise(run_dir, lock_fds=fds[1:], notify_fd=fds[0])
    except BaseException:
        with contextlib.suppress(BaseException):
            log.exception("zygote child failed")
    finally:
        os._exit(code)


class _LazyLog(logging.FileHandler):
    """A forked watchdog's log file, created (0600, no symlink followed) with its first record.

    A record that cannot be written (the file cannot be created: no inode left, a symlink in its
    place) is dropped: logging never raises into the watchdog, which must still stop the job and
    record its end. The next record tries again.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path, mode="a", encoding="utf-8", delay=True)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            super().emit(record)  # (FileHandler opens the file outside its own error handling)
        except OSError:
            self.handleError(record)  # to stderr, which is /dev/null here: never raises

    def _open(self) -> io.TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        return open(fd, "a", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
