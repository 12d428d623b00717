"""Why a job waits, in one line that starts with a short code, like squeue's REASON column.

A waiting job's reason reads ``<Code>: <words>``, e.g. ``Resources: cpu slots 1 free of 2 on ws-1
(needs 2)``: the code says what kind of wait it is (the same for every job waiting for the
same kind of thing), the words the deciding numbers, file paths last (a cut line keeps the
meaning). :func:`reason_of` maps an :class:`~gpulayerd.core.verdict.Explanation` to its
reason; :data:`MEANINGS` documents every code. Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from gpulayerd.core.verdict import Explanation, FitState, Rejection, RejectionCode, Verdict, WorkerExplanation

__all__ = ["MEANINGS", "Reason", "ReasonCode", "code_for", "code_of", "reason_of", "reason_text", "removed_reason",
           "split"]


class ReasonCode(str, enum.Enum):
    """The short code a waiting job's reason starts with (see :data:`MEANINGS`)."""

    PENDING = "Pending"
    READY = "Ready"
    RESOURCES = "Resources"
    FAIR_SHARE = "FairShare"
    USER_CAP = "UserCap"
    HOSTS = "Hosts"
    GANG_SKEW = "GangSkew"
    OFFLINE = "Offline"
    NO_WORKER = "NoWorker"
    REJECTED = "Rejected"
    DEVICE_COUNT = "DeviceCount"
    ACCELERATOR = "Accelerator"
    MEMORY = "Memory"
    COMPUTE_CAPABILITY = "ComputeCapability"
    FLOAT64 = "Float64"
    UNKNOWN = "Unknown"
    PROBE = "Probe"
    ENVIRONMENT = "Environment"
    PYTHON = "Python"
    FRAMEWORK = "Framework"
    WORKDIR = "Workdir"
    NO_ACCOUNT = "NoAccount"
    NOT_ALLOWED = "NotAllowed"
    DRIVER = "Driver"
    OS = "OS"
    REMOVED = "Removed"
    DEPENDENCY = "Dependency"
    DEPENDENCY_NEVER_SATISFIED = "DependencyNeverSatisfied"
    ARRAY = "Array"
    TARGET = "Target"


MEANINGS: dict[ReasonCode, str] = {
    ReasonCode.PENDING: "not judged yet (just submitted or requeued): the next scheduling pass says",
    ReasonCode.READY: "fits a worker now: being started there (or offered to it)",
    ReasonCode.RESOURCES: "fits, but every qualifying device (or CPU slot) is held: by other gpulayer jobs (named) "
                          "or by processes gpulayer did not start (their pids)",
    ReasonCode.FAIR_SHARE: "fits, devices free up, but a user with less recent usage goes first (named)",
    ReasonCode.USER_CAP: "fits, but the user holds max_gpus_per_user GPUs there already",
    ReasonCode.HOSTS: "a multi-host job: fewer workers fit than it needs hosts",
    ReasonCode.GANG_SKEW: "a multi-host job: enough workers fit, but no set of them has the same framework "
                          "versions and Python minor version",
    ReasonCode.OFFLINE: "fits only workers that are offline",
    ReasonCode.NO_WORKER: "no worker is known",
    ReasonCode.REJECTED: "no worker can ever run it (checked at submit)",
    ReasonCode.DEVICE_COUNT: "no worker has that many devices (or CPU slots) of the kind in all, even all free",
    ReasonCode.ACCELERATOR: "no worker has a device of the wanted kind that gpulayer runs jobs on",
    ReasonCode.MEMORY: "the devices have too little memory, or the wrong kind",
    ReasonCode.COMPUTE_CAPABILITY: "the CUDA compute capability is too low",
    ReasonCode.FLOAT64: "the devices have no 64-bit floats",
    ReasonCode.UNKNOWN: "a value the job needs is unknown (not probed), so the fit cannot be confirmed",
    ReasonCode.PROBE: "the device probe failed",
    ReasonCode.ENVIRONMENT: "no working Python environment",
    ReasonCode.PYTHON: "no environment has the wanted Python version",
    ReasonCode.FRAMEWORK: "a framework (torch, ...) is missing, of another version, or lacks a backend",
    ReasonCode.WORKDIR: "the workdir is missing, cannot be entered by the user, or did not answer",
    ReasonCode.NO_ACCOUNT: "the job's user has no account on the worker",
    ReasonCode.NOT_ALLOWED: "the worker does not run this user's jobs (personal worker, root jobs off, not vouched)",
    ReasonCode.DRIVER: "the NVIDIA driver is older than required, or too old for the environment's CUDA build",
    ReasonCode.OS: "no worker runs the wanted operating system",
    ReasonCode.REMOVED: "this machine was removed from the cluster: only it can run its jobs now, and it does "
                        "not fit here (the reason here follows; gpulayer cluster show says what to do)",
    ReasonCode.DEPENDENCY: "waits for a job it names with --after to end (which one, its state and where)",
    ReasonCode.DEPENDENCY_NEVER_SATISFIED: "ended cancelled: a job it names with --after ended so that the "
                                           "dependency can never be satisfied (which one, how it ended)",
    ReasonCode.ARRAY: "an array: its tasks run as jobs of their own (ID_7); its tasks counted by state",
    ReasonCode.TARGET: "every worker that could run it is one it may not use: not the worker it names "
                       "(--worker), or a Slurm worker (--no-slurm)",
}
"""Every code and what it means (docs/architecture.md, "Reasons", shows the same table)."""

_BY_REJECTION: dict[RejectionCode, ReasonCode] = {
    RejectionCode.UNSUPPORTED_ACCELERATOR: ReasonCode.REJECTED,
    RejectionCode.DISTRIBUTED_UNSUPPORTED: ReasonCode.REJECTED,
    RejectionCode.BACKEND_MISMATCH: ReasonCode.FRAMEWORK,
    RejectionCode.ACCELERATOR_MISMATCH: ReasonCode.ACCELERATOR,
    RejectionCode.EXECUTION_UNSUPPORTED: ReasonCode.ACCELERATOR,
    RejectionCode.PROBE_UNHEALTHY: ReasonCode.PROBE,
    RejectionCode.NOT_ENOUGH_DEVICES: ReasonCode.DEVICE_COUNT,
    RejectionCode.INSUFFICIENT_MEMORY: ReasonCode.MEMORY,
    RejectionCode.MEMORY_KIND_MISMATCH: ReasonCode.MEMORY,
    RejectionCode.COMPUTE_CAPABILITY_TOO_LOW: ReasonCode.COMPUTE_CAPABILITY,
    RejectionCode.FLOAT64_UNSUPPORTED: ReasonCode.FLOAT64,
    RejectionCode.UNKNOWN_METRIC: ReasonCode.UNKNOWN,
    RejectionCode.ENVIRONMENT_BROKEN: ReasonCode.ENVIRONMENT,
    RejectionCode.PYTHON_VERSION: ReasonCode.PYTHON,
    RejectionCode.FRAMEWORK_MISSING: ReasonCode.FRAMEWORK,
    RejectionCode.FRAMEWORK_VERSION: ReasonCode.FRAMEWORK,
    RejectionCode.INVALID_VERSION: ReasonCode.FRAMEWORK,
    RejectionCode.TORCH_BACKEND_UNAVAILABLE: ReasonCode.FRAMEWORK,
    RejectionCode.WORKDIR_MISSING: ReasonCode.WORKDIR,
    RejectionCode.WORKDIR_UNANSWERED: ReasonCode.WORKDIR,
    RejectionCode.WORKDIR_DENIED: ReasonCode.WORKDIR,
    RejectionCode.RESERVED: ReasonCode.RESOURCES,
    RejectionCode.FOREIGN_PROCESS: ReasonCode.RESOURCES,
    RejectionCode.WORKER_OFFLINE: ReasonCode.OFFLINE,
    RejectionCode.NO_ACCOUNT: ReasonCode.NO_ACCOUNT,
    RejectionCode.OTHER_USERS_WORKER: ReasonCode.NOT_ALLOWED,
    RejectionCode.ROOT_JOBS_NOT_ALLOWED: ReasonCode.NOT_ALLOWED,
    RejectionCode.USER_NOT_VOUCHED: ReasonCode.NOT_ALLOWED,
    RejectionCode.USER_GPU_CAP: ReasonCode.USER_CAP,
    RejectionCode.FAIR_SHARE: ReasonCode.FAIR_SHARE,
    RejectionCode.OS_MISMATCH: ReasonCode.OS,
    RejectionCode.DRIVER_TOO_OLD: ReasonCode.DRIVER,
    RejectionCode.CUDA_DRIVER_INCOMPATIBLE: ReasonCode.DRIVER,
    RejectionCode.CUDA_RUNTIME_MISMATCH: ReasonCode.FRAMEWORK,
    RejectionCode.WORKER_TARGET: ReasonCode.TARGET,
    RejectionCode.SLURM_REFUSED: ReasonCode.NOT_ALLOWED,
    RejectionCode.SLURM_LAST: ReasonCode.RESOURCES,  # (a workstation fits now: the job is Ready there)
}

# The ladder: among the rejections of the rows that decide, the first kind found here decides.
# A limit no waiting lifts (the per-user cap), then a constraint no known device can ever meet,
# then devices held by others (Resources: every holder named; FairShare, holders still named, when a
# user with less usage holds some of them or waits ahead), then the fair-share order (others
# go first once devices free up), then what may be transient (unknown values, a probe's trouble
# with a device, which decides only when nothing else keeps the job off that device), then the
# device count (alone when the worker has fewer devices in all).
_LADDER: tuple[frozenset[RejectionCode], ...] = (
    frozenset({RejectionCode.USER_GPU_CAP}),
    frozenset({RejectionCode.ACCELERATOR_MISMATCH, RejectionCode.EXECUTION_UNSUPPORTED, RejectionCode.OS_MISMATCH,
               RejectionCode.NO_ACCOUNT, RejectionCode.OTHER_USERS_WORKER, RejectionCode.ROOT_JOBS_NOT_ALLOWED,
               RejectionCode.USER_NOT_VOUCHED, RejectionCode.SLURM_REFUSED, RejectionCode.DRIVER_TOO_OLD,
               RejectionCode.CUDA_DRIVER_INCOMPATIBLE,
               RejectionCode.INSUFFICIENT_MEMORY, RejectionCode.MEMORY_KIND_MISMATCH,
               RejectionCode.COMPUTE_CAPABILITY_TOO_LOW, RejectionCode.FLOAT64_UNSUPPORTED,
               RejectionCode.ENVIRONMENT_BROKEN, RejectionCode.PYTHON_VERSION, RejectionCode.FRAMEWORK_MISSING,
               RejectionCode.FRAMEWORK_VERSION, RejectionCode.INVALID_VERSION, RejectionCode.TORCH_BACKEND_UNAVAILABLE,
               RejectionCode.BACKEND_MISMATCH, RejectionCode.CUDA_RUNTIME_MISMATCH, RejectionCode.WORKDIR_MISSING,
               RejectionCode.WORKDIR_DENIED}),
    frozenset({RejectionCode.RESERVED, RejectionCode.FOREIGN_PROCESS}),
    frozenset({RejectionCode.FAIR_SHARE}),
    frozenset({RejectionCode.UNKNOWN_METRIC, RejectionCode.WORKDIR_UNANSWERED, RejectionCode.WORKER_OFFLINE}),
    frozenset({RejectionCode.PROBE_UNHEALTHY}),
    # "needs N qualifying devices, has K" follows from the devices' own rejections above; alone (more
    # than the worker has in all, even free) it decides as DeviceCount.
    frozenset({RejectionCode.NOT_ENOUGH_DEVICES}),
    frozenset({RejectionCode.WORKER_TARGET}),  # (decides only when every row is a worker the job may not use)
)
_HELD = frozenset({RejectionCode.RESERVED, RejectionCode.FOREIGN_PROCESS, RejectionCode.PROBE_UNHEALTHY})
_MAX_NAMED = 3  # holders named in one Resources reason; "and N more" after

_PREFIX = re.compile(r"^([A-Za-z0-9]+): ")
_KNOWN = {c.value for c in ReasonCode}


@dataclass(frozen=True, slots=True)
class Reason:
    """A waiting job's reason: its code and the deciding words."""

    code: ReasonCode
    words: str

    @property
    def text(self) -> str:
        """``"<Code>: <words>"``, as stored and shown."""
        return f"{self.code.value}: {self.words}"


def reason_of(e: Explanation) -> Reason:
    """The reason a job waits, from its explanation (verdict, rows and rejections).

    Job-level rejections give ``Rejected``; "fits now" gives ``Ready``; no worker gives
    ``NoWorker``. Otherwise the rows of the verdict's state decide (the busy rows for
    "fits but busy", the offline rows, else the rows that do not fit), each by the ladder
    (more devices than the worker has in all first, then :data:`_LADDER`: per-user cap > a
    constraint no device meets > devices held, every holder named > the fair-share order > unknown
    or transient > a probe's trouble > too few qualifying devices; devices held while a user with
    less usage holds some or waits ahead read ``FairShare``, the holders named after who goes first):
    of busy rows the one closest to running, else the first (node-id order). A multi-host job's
    words start with how many hosts fit now.
    """
    if e.rejections:
        return Reason(ReasonCode.REJECTED, "; ".join(r.message for r in e.rejections))
    if e.verdict is Verdict.FITS_NOW:
        return Reason(ReasonCode.READY, _fits_now(e))
    if not e.workers:
        return Reason(ReasonCode.NO_WORKER, "no worker known")
    state = {Verdict.FITS_BUT_BUSY: FitState.FITS_BUT_BUSY,
             Verdict.FITS_ONLY_OFFLINE: FitState.FITS_OFFLINE}.get(e.verdict, FitState.NO_FIT)
    rows = [w for w in e.workers if w.state is state and w.rejections]
    rows = [w for w in rows if not _skipped(w)] or rows  # a worker it may not use (--worker) never decides
    hosts = ""
    if e.hosts_needed > 1:
        now = sum(1 for w in e.workers if w.state is FitState.FITS_NOW)
        hosts = f"needs {e.hosts_needed} hosts at once, {now} fit now"
    deciding = _deciding(rows, state is FitState.FITS_BUT_BUSY)
    if deciding is None:  # a multi-host job with too few workers (or a row without a rejection)
        return Reason(ReasonCode.HOSTS if hosts else ReasonCode.NO_WORKER, hosts or e.verdict.value)
    row, rej = deciding
    words = _words(rej, row)
    code = _BY_REJECTION.get(rej.code, ReasonCode.DEVICE_COUNT)
    if rej.code in (RejectionCode.RESERVED, RejectionCode.FOREIGN_PROCESS) and rej.device is not None:
        # Every holder of the devices the job could use (and a device that needs attention) is named.
        held = [r for r in row.rejections if r.code in _HELD and r.device is not None]
        more = f"; and {len(held) - _MAX_NAMED} more" if len(held) > _MAX_NAMED else ""
        words = "; ".join(r.message for r in held[:_MAX_NAMED]) + more + f" (on {row.name or row.worker})"
        fair = next((r for r in row.rejections if r.code is RejectionCode.FAIR_SHARE), None)
        if fair is not None:
            # Held devices, and a user with less usage holds some or waits ahead: who goes first
            # decides once they free up, so that is the code; the holders stay named.
            code, words = ReasonCode.FAIR_SHARE, f"{fair.message}; {words}"
    return Reason(code, f"{hosts}; {words}" if hosts else words)


def reason_text(e: Explanation) -> str:
    """``reason_of(e).text``: the line stored as a waiting job's reason."""
    return reason_of(e).text


def removed_reason(reason: str) -> str:
    """The reason shown for a waiting job of a machine removed from the cluster: ``Removed: …``, with
    ``reason`` (how it stands on this machine alone) after it. A reason with no code (not judged yet:
    "waiting for the scheduler", or ``""``) stays as it is."""
    if not code_of(reason):
        return reason
    return (f"{ReasonCode.REMOVED.value}: this machine was removed from the cluster and runs its jobs alone "
            f"(gpulayer cluster show) · {reason}")


def split(text: str) -> tuple[str, str]:
    """``(code, words)`` of a stored reason; ``("", text)`` when it starts with no known code."""
    m = _PREFIX.match(text)
    if m is None or m.group(1) not in _KNOWN:
        return "", text
    return m.group(1), text[m.end():]


def code_of(text: str) -> str:
    """The code a reason starts with, or ``""`` (see :func:`split`)."""
    return split(text)[0]


def code_for(status: str, reason: str) -> str:
    """The code of a job in ``status`` with ``reason``: the reason's own code; else ``Pending``
    for a queued job (not judged since it was submitted or requeued), ``Rejected`` for a
    rejected one, ``""`` for any other state."""
    code = code_of(reason)
    if code:
        return code
    return {"queued": ReasonCode.PENDING.value, "rejected": ReasonCode.REJECTED.value}.get(status, "")


# -------------------------------------------------------------------------- internals


def _fits_now(e: Explanation) -> str:
    if e.hosts_needed > 1:
        return f"fits now on {e.hosts_needed} hosts"
    p = e.placement
    if p is None:
        return "fits now"
    name = next((w.name for w in e.workers if w.worker == p.worker), "") or p.worker
    devs = ",".join(str(i) for i in p.device_indices)
    return f"fits now on {name}" + (f" GPU {devs}" if devs else "")


def _skipped(row: WorkerExplanation) -> bool:
    """Whether the job may not use ``row``'s worker at all (``--worker``, ``--no-slurm``)."""
    return any(r.code is RejectionCode.WORKER_TARGET for r in row.rejections)


def _deciding(rows: list[WorkerExplanation], busy: bool) -> tuple[WorkerExplanation, Rejection] | None:
    """Each row's decisive rejection is its one highest on :data:`_LADDER` (its first when none is on it).
    Of rows that fit but are busy, the row closest to running decides (lowest on the ladder: a row
    where only the fair-share order holds the job back beats one whose devices are all held); else the
    first row (node-id order)."""
    if not rows:
        return None
    picked = [(_rank(r), row, r) for row in rows for r in [_decisive(row)]]
    if busy:
        _, row, rej = max(picked, key=lambda p: p[0])
        return row, rej
    return picked[0][1], picked[0][2]


def _decisive(row: WorkerExplanation) -> Rejection:
    for r in row.rejections:  # more devices than the worker has in all: nothing else matters there
        if r.code is RejectionCode.NOT_ENOUGH_DEVICES and r.found.endswith(" in all"):
            return r
    if row.state is FitState.NO_FIT:
        # On a worker where the job does not fit, what is true of the worker as a whole (its
        # environments, workdir, accounts) decides first; then a device the job could run on but the
        # probe lost (it may come back); then too few qualifying devices when some qualify (the
        # shortfall, not one device's objection); then the devices' own objections.
        for step in range(3):
            found = next((r for r in row.rejections if _early(r, step)), None)
            if found is not None:
                return found
    for kinds in _LADDER:
        for r in row.rejections:
            if r.code in kinds:
                return r
    return row.rejections[0]


def _early(r: Rejection, step: int) -> bool:
    """The three kinds that decide first on a worker where the job does not fit, in ``step`` order."""
    if step == 0:
        return r.code in _LADDER[1] and r.device is None  # the worker's environments, workdir, accounts
    if step == 1:
        return r.code is RejectionCode.PROBE_UNHEALTHY and r.device is not None  # a device it could run on
    # some qualify, too few (the worker's count; not a device's own "MIG instance" objection)
    return (r.code is RejectionCode.NOT_ENOUGH_DEVICES and r.device is None and r.found.isdigit()
            and r.found != "0")


def _rank(r: Rejection) -> int:
    return next((i for i, kinds in enumerate(_LADDER) if r.code in kinds), -1)  # ("in all": last, never busy)


def _words(r: Rejection, row: WorkerExplanation) -> str:
    """The rejection's words: the numbers first, the worker, file paths last."""
    name = row.name or row.worker
    if r.code is RejectionCode.RESERVED and r.device is None:  # CPU slots
        have = next((c.found for c in row.checks if c.requirement == r.requirement), r.found)
        return f"{r.requirement} {have} on {name} (needs {r.wanted})"
    if r.code in (RejectionCode.WORKDIR_MISSING, RejectionCode.WORKDIR_DENIED, RejectionCode.WORKDIR_UNANSWERED):
        path = r.wanted
        text = r.message.replace(f"enter {path}", "enter the workdir").replace(f"workdir {path}", "workdir")
        return f"{text}: {path}"
    if r.environment:
        env = r.environment
        text = r.message.replace(f" in {env}", "").replace(f"environment {env}", "environment")
        return f"{text} on {name} in {env}"
    if r.device is not None:
        return f"{r.message} (on {name})"
    return r.message
