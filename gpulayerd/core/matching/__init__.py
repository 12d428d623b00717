"""Matching a job to a worker (pure): requirements and versions, nearest-miss hints, runtime
profiles, device shapes and indexes, runtime and CUDA-compatibility checks, and :mod:`.evaluate`,
which puts them together (the verdict types are :mod:`gpulayerd.core.verdict`, shared with fair
share and reasons)."""
