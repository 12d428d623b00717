"""The pure scheduling core: no I/O, no clock, no randomness; imports the stdlib and ``packaging``
only. :mod:`.types`, :mod:`.verdict` and :mod:`.job_facts` (shared values), :mod:`.matching` (a job
against a worker), :mod:`.protocol` (the claim, worker, gang and hold state machines),
:mod:`.fairshare`, :mod:`.users`, :mod:`.reasons`, :mod:`.launch`, :mod:`.job_policy` (time limits,
warning signals, the retry policy), :mod:`.visible` (which GPUs the daemon may schedule), :mod:`.arrays`
(job arrays: ``--array``, task ids, late materialization), :mod:`.dependencies` (``--after``, judged)
and :mod:`.scheduling` (the scheduler's pass, decided); :mod:`.shipping` (the rules of a
shipped workdir: paths, manifests, caps)."""
