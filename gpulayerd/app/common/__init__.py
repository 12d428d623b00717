"""What every role of the daemon shares: the clock (:mod:`.clock`), the signals between services
(:mod:`.signals`) and the in-daemon change feed (:mod:`.feed`), the protocols services are given
(:mod:`.ports`), node names (:mod:`.names`), who asks the local API (:mod:`.requester`), the jobs
owned here through the claim machine (:mod:`.owned_jobs`: the owner decides with it, the worker
reports local starts and exits to it), the attempt stopper both use (:mod:`.stopper`), what this
machine handed out (:mod:`.ledger`), fair-share
usage (:mod:`.usage`), chunked log reads (:mod:`.logread`) and the supervisor of the long-running
loops (:mod:`.supervisor`).

Imports nothing from ``app.owner``, ``app.worker`` or ``app.cluster``.
"""
