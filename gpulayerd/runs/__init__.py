"""Job attempts on this machine: the :mod:`.runner` (with :mod:`.status`), the per-job :mod:`.watchdog`
(reading :mod:`.launchfile`, checking the job's environment first with :mod:`.preflight`, starting
the job with :mod:`.jobstart`, copying output with
:mod:`.logcopy`, keeping an unrecorded exit with :mod:`.exitnote`) and the :mod:`.zygote` that forks
it, the command line and account of a job (:mod:`.launch`, :mod:`.account`), device locks
(:mod:`.devicelock`), the run-dir :mod:`.layout`, process identity and trees (:mod:`.process`) and
waiting without ``select`` (:mod:`.waiting`).

Import the submodules directly. This package imports nothing itself: the watchdog starts as
``python -m gpulayerd.runs.watchdog`` (or is forked by ``python -m gpulayerd.runs.zygote``) and its
start-up must stay light (stdlib and psutil).
"""
