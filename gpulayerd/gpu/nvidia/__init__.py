"""NVIDIA GPUs through ``nvidia-smi``: the queries (:mod:`.query`), parsing their output
(:mod:`.parse`), the second pass over the devices (:mod:`.followup`: MIG mode, lost GPUs, unknown
processes) and MIG instances (:mod:`.mig`)."""
