"""The owner role: jobs submitted to this machine. Submit, cancel, list, explain and logs
(:mod:`.owner`), idempotent submits (:mod:`.idempotency`), profiles expanded at submit
(:mod:`.profile_expansion`), the scheduler's I/O driver (:mod:`.scheduler`; its decisions are
:mod:`gpulayerd.core.scheduling`), gang placement (:mod:`.gang_placement`), explanations of a job's state
(:mod:`.explainer`), the rows a listing reads (:mod:`.listing`: the latest finished ones, arrays by
the state they show), job arrays (:mod:`.array_book`: tasks materialized lazily) and dependencies
(:mod:`.dependency_gate`: jobs held back until what they name with ``--after`` has ended), and shipped
workdirs (:mod:`.ship_server`: snapshots uploaded here, contents served to the holder, outputs back), and
the user's notify command run when a job starts or ends (:mod:`.notifier`), and accounting over a period
with the retention of finished jobs (:mod:`.accounting`), and where a waiting job stands: its position,
holders and start estimate (:mod:`.queue_context`).

May use ``app.worker`` (a job owned here can run here) and ``app.common``; ``app.worker`` never
imports it.
"""
