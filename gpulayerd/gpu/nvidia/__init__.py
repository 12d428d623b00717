"""NVIDIA GPUs through ``nvidia-smi``: the queries (:mod:`.query`), parsing their output
(:mod:`.parse`), devices and their health (:mod:`.devices`) and MIG instances (:mod:`.mig`)."""
