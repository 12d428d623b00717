"""Matching a job to a worker (pure): :mod:`.requirements` and :mod:`.versions`, nearest-miss
:mod:`.hints` (with :mod:`.hint_versions`), runtime :mod:`.profiles`, device :mod:`.shapes`, device
states and use in reasons (:mod:`.device_state`), the explain table's device rows
(:mod:`.devicerows`), gang members checked against each other (:mod:`.gangskew`), the workers a job may use at all
(:mod:`.targeting`: ``--worker``, ``--no-slurm``) and the
fit-only :mod:`.index`, :mod:`.runtime_checks` and :mod:`.cuda_compat`, and :mod:`.evaluate`, which
puts them together (the verdict types are :mod:`gpulayerd.core.verdict`, shared with fair share and
reasons)."""
