"""The daemon's services, by role: each one object with narrow collaborators passed in, built in
dependency order by :mod:`gpulayerd.daemon`.

- :mod:`.common`: what every role shares (clock, signals and the change feed, ports, names, who
  asks, the jobs owned here, the attempt stopper, the ledger, fair-share usage, log reads, the
  loops' supervisor).
- :mod:`.worker`: attempts that run on this machine (the machine, accounts, environment checks,
  the worker service, the starter, a gang member, live metrics, recovery).
- :mod:`.owner`: jobs submitted here (the owner service, idempotent submits, profile expansion,
  the scheduler and its helpers, gang placement, explanations).
- :mod:`.cluster`: membership and heartbeats, trust at run time, the self-first transport.
- :mod:`.roles`: THE role checks of the route table (peer and local routes).
- :mod:`.remote_jobs`: any job id on any machine of the cluster.
- :mod:`.local`: the local API's service; :mod:`.leases`: the one-second lease tick; :mod:`.openmetrics`:
  this daemon in the Prometheus text format (``GET /metrics``).
"""
