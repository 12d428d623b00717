"""gpulayerd: GPU compute sharing for a lab's workstations.

The top level: the entry point (``__main__``), the composition root (:mod:`.daemon`), settings
(:mod:`.config`), domain errors (:mod:`.errors`) and text shared by the CLI and the TUI
(:mod:`.text`, and :mod:`.termsafe`, which makes a job's output safe for a terminal). The
packages, lowest layer first: :mod:`.core` (pure decisions), :mod:`.routes` (THE route table),
:mod:`.store` and :mod:`.models`, then :mod:`.host`, :mod:`.gpu`, :mod:`.net`, :mod:`.runs` and
:mod:`.ship` (this machine, its hardware, the network, job attempts, shipped workdirs) and
:mod:`.slurm` (a Slurm cluster as a worker), :mod:`.app`
(the services), :mod:`.api`
(HTTP) and :mod:`.cli` (``gpulayer``). docs/architecture.md draws them.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
