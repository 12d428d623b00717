"""State-aware explanations: where a job that is not waiting runs or ran, and how it ended.

``explain`` of a queued job judges it against every worker (the table and the verdict);
any other job gets a ``state`` section instead (:class:`~gpulayerd.models.JobStateModel`)
and a verdict naming its state, never "fits": claimed/running → node, GPUs, environment,
since, attempt, lease; succeeded/failed → outcome, exit code or signal, where it ran,
duration, and for a failure the last lines of its stderr; cancelled/lost/rejected → why and
by whom, from the job's event history.

:func:`build_state` and :func:`state_explanation` are pure (rows in, models out);
:func:`local_tail` and :func:`remote_tail` read the stderr tail (off the event loop, or
through the owner's peer ``logs`` route).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulayerd import text as fmt
from gpulayerd.core.matching.evaluate import explain
from gpulayerd.core.matching.hints import nearest_misses
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.core.reasons import ReasonCode
from gpulayerd.core.types import JobRequest, SupportMatrix, WorkerSnapshot
from gpulayerd.core.verdict import Verdict
from gpulayerd.models import ExplanationModel, HintModel, JobStateModel, LogChunk
from gpulayerd.models.stored import read_placement
from gpulayerd.store import JobRow
from gpulayerd.store.rows import AttemptRow, EventRow

__all__ = [
    "REMOTE_TAIL_CHUNKS",
    "TAIL_BYTES",
    "TAIL_LINES",
    "Tail",
    "build_state",
    "describe_exit",
    "explain_with_hints",
    "held_back",
    "local_tail",
    "remote_tail",
    "state_explanation",
    "state_verdict",
    "tail_of",
]

TAIL_LINES = 20
"""The most lines of stderr an explanation carries."""

TAIL_BYTES = 4096
"""The most bytes of stderr an explanation carries (the end of the log)."""

REMOTE_TAIL_CHUNKS = 4
"""The most log chunks (1 MiB each) read from a worker to find the end of a remote stderr."""

CANCEL_KIND = "cancel requested"
"""The event kind of a cancel (``cancel requested by <user>`` names who asked)."""


@dataclass(frozen=True, slots=True)
class Tail:
    """The end of a stderr log, or why there is none.

    Attributes:
        lines: the last lines (at most :data:`TAIL_LINES`, :data:`TAIL_BYTES`); None: not read.
        note: why there are no lines, or how much of the log they are ("" for nothing to say).
    """

    lines: list[str] | None
    note: str = ""


def describe_exit(code: int | None) -> str:
    """``exited 3``, ``killed by signal 9`` (a negative code), or ``exit status unknown`` (None)."""
    if code is None:
        return "exit status unknown"
    return f"killed by signal {-code}" if code < 0 else f"exited {code}"


def tail_of(data: bytes, *, whole: bool) -> Tail:
    """The last lines of ``data``, the end of a log.

    Args:
        data: at most the log's last :data:`TAIL_BYTES` bytes (more are cut from the front).
        whole: ``data`` is the whole log; otherwise its first (cut) line is dropped.

    Returns:
        At most :data:`TAIL_LINES` lines (trailing blank lines dropped), with a note saying
        how much was left out; an empty log gives no lines and the note ``stderr is empty``.
    """
    if len(data) > TAIL_BYTES:
        data, whole = data[-TAIL_BYTES:], False
    lines = data.decode("utf-8", errors="replace").splitlines()
    if not whole and lines:
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        return Tail([], "stderr is empty" if whole else "no whole line in the last 4 KiB of stderr")
    cut = not whole or len(lines) > TAIL_LINES
    lines = lines[-TAIL_LINES:]
    n = len(lines)
    return Tail(lines, f"the last {n} line{'s' if n != 1 else ''} of stderr" if cut else "")


def _read_end(path: Path) -> tuple[bytes, int] | None:
    with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - TAIL_BYTES))
        return f.read(TAIL_BYTES), size
    return None


async def local_tail(path: Path) -> Tail:
    """The end of the stderr log at ``path`` on this machine (read in a thread)."""
    found = await asyncio.to_thread(_read_end, path)
    if found is None and await asyncio.to_thread(path.parent.is_dir):
        found = b"", 0  # the run directory is here: a job that wrote nothing has no log file
    if found is None:
        return Tail(None, "no stderr log on this machine")
    data, size = found
    return tail_of(data, whole=len(data) >= size)


async def remote_tail(fetch: Callable[[int], Awaitable[LogChunk]]) -> Tail:
    """The end of a stderr log another node holds, read through ``fetch(offset)`` (a log chunk from ``offset``).

    One chunk from 0; when the log is longer and the worker tells its ``size``, one more from
    its last :data:`TAIL_BYTES`; from a worker that does not, at most
    :data:`REMOTE_TAIL_CHUNKS` chunks in order (a longer log gets no lines and a note).
    Errors of ``fetch`` (PeerUnreachable, NoSuchJob) propagate.
    """
    chunk = await fetch(0)
    if chunk.complete:
        return tail_of(chunk.data.encode("utf-8"), whole=True)
    if chunk.size is not None and chunk.size > chunk.next_offset:
        last = await fetch(max(chunk.next_offset, chunk.size - TAIL_BYTES))
        return tail_of(last.data.encode("utf-8"), whole=False)
    kept, offset = chunk.data.encode("utf-8")[-TAIL_BYTES:], chunk.next_offset
    for _ in range(REMOTE_TAIL_CHUNKS - 1):
        if chunk.complete or chunk.next_offset <= chunk.offset:
            break
        chunk = await fetch(offset)
        kept, offset = (kept + chunk.data.encode("utf-8"))[-TAIL_BYTES:], chunk.next_offset
    if chunk.complete or chunk.next_offset <= chunk.offset:
        return tail_of(kept, whole=offset <= TAIL_BYTES)
    return Tail(None, f"stderr is over {fmt.size(offset)}: see gpulayer logs")


def _since(row: JobRow, events: Sequence[EventRow]) -> float | None:
    """When the job entered its current state (the last event that moved it there)."""
    at = None
    for e in events:
        if e.to_status is row.status and e.from_status is not row.status:
            at = e.at
    return at


def _by(row: JobRow, attempt: AttemptRow | None, events: Sequence[EventRow], owner_name: str,
        name_of: Callable[[str | None], str | None]) -> str | None:
    """Who brought a cancelled, lost or rejected job there (None: not known, or not such a state)."""
    if row.status is JobStatus.CANCELLED:
        for e in reversed(events):
            if e.kind.startswith(CANCEL_KIND + " by "):
                return e.kind[len(CANCEL_KIND + " by "):]
        # A queued job's cancel moves it at once: its reason says who ("cancelled by alice").
        who = row.reason[len("cancelled by "):] if row.reason.startswith("cancelled by ") else ""
        return who if who and who != "user" and not who.startswith("user ") else None
    if row.status is JobStatus.LOST:
        if "no lease renewal" in row.reason:
            return f"{owner_name} (its owner: the lease ran out)"
        return name_of(attempt.worker) if attempt is not None else None
    if row.status is JobStatus.REJECTED:
        return f"{owner_name} (its owner, at submit)"
    return None


def build_state(row: JobRow, attempts: Sequence[AttemptRow], events: Sequence[EventRow], *,
                owner_name: str, name_of: Callable[[str | None], str | None],
                readable: Callable[[str], str] = lambda s: s, lease_expires_at: float | None = None,
                tail: Tail | None = None) -> JobStateModel:
    """The ``state`` section of a job that is not queued (pure).

    Args:
        row: the job.
        attempts: its attempts (the one numbered ``row.attempt`` is described).
        events: its history, oldest first.
        owner_name: this (the owner's) host name.
        name_of: node id → host name.
        readable: text → text with node ids replaced by names.
        lease_expires_at: the current attempt's lease end, wall seconds (None: none runs).
        tail: the stderr tail of a failed attempt, or why there is none (None: not asked).
    """
    attempt = next((a for a in attempts if a.attempt == row.attempt), None)
    state = JobStateModel(status=row.status.value, attempt=row.attempt, since=_since(row, events),
                          reason=readable(row.reason), cancel_requested=row.cancel_requested)
    if attempt is not None:
        stored = read_placement(attempt.placement_json)
        state.node, state.node_name = attempt.worker, name_of(attempt.worker)
        state.gpus = stored.device_indices
        state.environment = stored.environment
        state.gang = stored.gang
        state.started_at, state.ended_at = attempt.started_at, attempt.ended_at
        if attempt.started_at is not None and attempt.ended_at is not None:
            state.duration_s = max(0.0, attempt.ended_at - attempt.started_at)
    if row.status in (JobStatus.CLAIMED, JobStatus.RUNNING):
        state.lease_expires_at = lease_expires_at
    code = row.exit_code if row.exit_code is not None else (attempt.exit_code if attempt is not None else None)
    if row.status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        state.exit_code = code
        state.signal = -code if code is not None and code < 0 else None
        state.outcome = describe_exit(code) if code is not None else (
            "exited 0" if row.status is JobStatus.SUCCEEDED else readable(row.reason) or "failed")
    elif row.status in (JobStatus.CANCELLED, JobStatus.LOST, JobStatus.REJECTED):
        state.outcome = row.status.value
        state.exit_code = code
        state.signal = -code if code is not None and code < 0 else None
    state.by = _by(row, attempt, events, owner_name, name_of)
    if tail is not None:
        state.stderr_tail, state.stderr_note = tail.lines, tail.note or None
    return state


def state_verdict(state: JobStateModel) -> str:
    """The verdict of a job that is not queued: its state, and for a failure how it ended."""
    if state.status == JobStatus.RUNNING.value and state.cancel_requested:
        return "running (cancel requested)"
    if state.status == JobStatus.FAILED.value:
        return f"failed: {state.outcome}" if state.outcome and state.outcome != "failed" else "failed"
    return state.status


def _summary(state: JobStateModel) -> str:
    where = fmt.where(state.node_name, state.gpus,
                      [m[:12] for m in state.gang] if len(state.gang) > 1 else ()) or "no worker"
    if state.status == JobStatus.CLAIMED.value:
        return f"claimed by {where}, attempt {state.attempt}: starting"
    if state.status == JobStatus.RUNNING.value:
        env = f" with {state.environment}" if state.environment else ""
        return f"running on {where}{env}, attempt {state.attempt}"
    if state.status in (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value):
        took = f" after {fmt.age(state.duration_s)}" if state.duration_s is not None else ""
        return f"{state.outcome} on {where}{took} (attempt {state.attempt})"
    by = f" by {state.by}" if state.by else ""
    return f"{state.status}{by}: {state.reason}" if state.reason else f"{state.status}{by}"


def state_explanation(job_id: str, state: JobStateModel, base: ExplanationModel | None = None) -> ExplanationModel:
    """The explanation of a job that is not queued: ``state``, its verdict and summary.

    ``base`` (a rejected job's stored explanation) keeps its rejections and worker table;
    any other job has none (judging a running or finished job against the workers says
    nothing true about it).
    """
    out = ExplanationModel(job_id=job_id, verdict=state_verdict(state), summary=_summary(state), state=state)
    if base is not None and state.status == JobStatus.REJECTED.value:
        out.rejections, out.workers, out.hosts_needed = base.rejections, base.workers, base.hosts_needed
    return out


def held_back(fresh: ExplanationModel, reason: str) -> ExplanationModel:
    """``fresh`` (a queued job judged against the workers) of a job the dependency gate holds back (its
    reason ``Dependency: ...``): its verdict says so first (``waits: Dependency: after ID (running); then
    fits now``), with no placement; any other job's ``fresh`` unchanged."""
    if not reason.startswith(f"{ReasonCode.DEPENDENCY.value}:"):
        return fresh
    return fresh.model_copy(update={"verdict": f"waits: {reason}; then {fresh.verdict}", "placement": None})


def explain_with_hints(req: JobRequest, workers: Sequence[WorkerSnapshot], support: SupportMatrix, *,
                       origins: dict[str, str] | None = None) -> ExplanationModel:
    """The explanation of a queued job (pure), with its nearest-miss hints when it fits nowhere
    or only a busy or offline worker (:func:`gpulayerd.core.matching.hints.nearest_misses`).

    Only explanations asked for (``explain``, ``show``) compute hints, never a scheduling pass.

    Args:
        req: the job.
        workers: this machine's snapshot and the peers'.
        support: the support matrix.
        origins: the spec's ``requirement_origins`` (a changed profile item names its profile).
    """
    e = explain(req, workers, support)
    model = ExplanationModel.from_core(e)
    if e.verdict is not Verdict.FITS_NOW:
        model.hints = [HintModel.from_core(h) for h in nearest_misses(req, workers, support, e, origins=origins)]
    return model
