"""Hardware and environment detection, and the support matrix: :mod:`.command` (THE subprocess
runner, subprocess's one importer: ``runs/`` starts watchdogs and jobs with it too), :mod:`.support`
(the support matrix), :mod:`.discovery` with :mod:`.nvidia`, :mod:`.apple`, :mod:`.rocm` and
:mod:`.cpus`, live GPU :mod:`.metrics`, the environments (:mod:`.probe`, run by each workload
interpreter; :mod:`.environments`, :mod:`.interpreters` (shims resolved, conda activation),
:mod:`.probe_report`, :mod:`.cuda_build`, :mod:`.dist_files`)
and :mod:`.compose` (hardware + environments -> Capabilities)."""
