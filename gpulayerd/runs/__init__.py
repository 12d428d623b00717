"""Job attempts on this machine: the runner, the per-job watchdog, device locks, run-dir layout.

Import the submodules directly. This package imports nothing itself: the watchdog starts as
``python -m gpulayerd.runs.watchdog`` (or is forked by ``python -m gpulayerd.runs.zygote``) and its
start-up must stay light (stdlib and psutil).
"""
