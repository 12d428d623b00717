"""The worker role: attempts that run on this machine, whoever owns them. This machine as a
worker (:mod:`.machine`, :mod:`.accounts`, :mod:`.envchecks`, the environments a pre-flight check found
broken: :mod:`.preflight_marks`), the attempts (:mod:`.worker`) and the
offers it keeps (:mod:`.kept_offers`), how
an attempt starts (:mod:`.starter`), a gang member's holds and commits (:mod:`.member`), live
device metrics (:mod:`.metrics`), re-adoption of runs after a restart (:mod:`.recovery`) and shipped
jobs fetched, unpacked and their outputs sent back (:mod:`.ship_client`); a Slurm cluster as this
worker (:mod:`.slurm_worker`).

Uses ``app.common`` only.
"""
