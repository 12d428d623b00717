"""The deterministic simulator: many real daemons in one process on a simulated network and clock.

Modules: :mod:`~tests.sim.clock` (true time and each daemon's skewed, pausable clock),
:mod:`~tests.sim.store` (the in-loop, in-memory SQLite driver), :mod:`~tests.sim.network`
(latency, loss, partitions, crashes, traffic accounting; each daemon's transport and
membership), :mod:`~tests.sim.invariants` (what is checked at every step), :mod:`~tests.sim.world`
(:class:`~tests.sim.world.Sim`: building, stepping, faults, jobs), :mod:`~tests.sim.workload`
(the lab job mix, the fault plan and the figures); ``test_sim.py`` holds its tests.
"""
