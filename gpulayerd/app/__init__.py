"""The daemon's services: each one object with narrow collaborators, wired by :mod:`gpulayerd.daemon`.

- :mod:`.machine`: this machine's capabilities, probing, and its snapshot for the matcher.
- :mod:`.jobs`: the jobs owned here driven through the pure claim machine (:mod:`gpulayerd.core.protocol.claims`).
- :mod:`.owner`: submit/list/show/cancel/logs of the jobs owned here; grants and reports from workers.
- :mod:`.scheduler`: one pass matches queued jobs and offers the rest to peers.
- :mod:`.worker`: runs on this machine (local and for other owners), claims, renewals, reports.
- :mod:`.gang`: gang coordinator (owner) and member (worker) of multi-host jobs.
- :mod:`.starter`: the one routine that starts an attempt.
- :mod:`.recovery`: re-adoption of runs after a restart.
- :mod:`.cluster`: membership and the peer API's dispatch to the services above.
"""
