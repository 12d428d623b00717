"""The scheduler's pass, decided (pure): :mod:`.passes` (:class:`SchedulerCore`, the state and the
pass as a generator of actions), :mod:`.steps` (what it keeps of a queued job, its actions and
their answers), :mod:`.judging` (queue keys, peer loads, fair share in a reason), :mod:`.retrying`
(retries held until their backoff ends; the worker a retry avoids) and :mod:`.successor` (a slot freed
by an array's task goes to the array's next task without a pass, when a pass would claim it first). The
service that carries the actions out is :mod:`gpulayerd.app.owner.scheduler`."""

from gpulayerd.core.scheduling.passes import CHUNK, REASON_BATCH, SchedulerCore
from gpulayerd.core.scheduling.steps import (
    Action,
    Answer,
    Claim,
    ClaimAnswered,
    Count,
    MachineRead,
    QueueChanges,
    QueuedJob,
    QueueLoaded,
    ReadChanges,
    ReadMachine,
    ReadQueue,
    Resume,
    SendOffer,
    StoreReasons,
    ToGang,
    Yield,
)
from gpulayerd.core.scheduling.successor import TimerPass

__all__ = ["CHUNK", "REASON_BATCH", "Action", "Answer", "Claim", "ClaimAnswered", "Count", "MachineRead",
           "QueueChanges", "QueueLoaded", "QueuedJob", "ReadChanges", "ReadMachine", "ReadQueue", "Resume",
           "SchedulerCore", "SendOffer", "StoreReasons", "TimerPass", "ToGang", "Yield"]
