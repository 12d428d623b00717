"""A Slurm cluster as one gpulayer worker (issue 36): a gpulayerd on a login node with ``[slurm]``.

- ``settings.py``: ``SlurmConfig``, the ``[slurm]`` section of the daemon's config.
- ``outputs.py``: parsing ``sinfo``/``squeue``/``scontrol`` output (JSON and ``-o`` forms) and the
  mapping of Slurm's job states and reasons to gpulayer's (pure).
- ``batch.py``: the generated batch script and ``sbatch`` command line (pure, every value shell-quoted).
- ``slurmcmd.py``: THE runner of Slurm's commands (through :mod:`gpulayerd.gpu.command`, with timeouts).
- ``capacity.py``: the cluster's partitions, nodes and GRES as this worker's inventory.
- ``queue.py``: ``squeue`` read once per poll interval for every waiting attempt (their pending reasons,
  queue positions, and when it last answered).
- ``srunprobe.py``: the configured interpreters probed in a short ``srun`` job on the cluster, cached.
- ``submit.py``: the watchdog's command line for an attempt on a Slurm worker (the proxy and its JSON).
- ``proxy.py``: ``python -m gpulayerd.slurm.proxy``: run by the job's watchdog as the job's user, it
  submits the batch job, follows it, copies its output, cancels it on SIGTERM and exits with its code.
"""
