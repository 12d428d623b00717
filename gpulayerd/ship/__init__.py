"""Shipped workdirs (``--ship``), the file work: :mod:`.walk` (the CLI lists and hashes the workdir), :mod:`.statcache`
(the CLI's per-user cache of file hashes by status, like git's index), :mod:`.upload` (the CLI
uploads what the daemon lacks),
:mod:`.content` (the owner's content store with its caps), :mod:`.blobcache` (a worker's bounded LRU
cache of contents), :mod:`.tree` (per-attempt trees and outputs, written and read without following
links) and :mod:`.asuser` (that work done as the job's user, in a helper started as that account).

The same layer as :mod:`gpulayerd.host` and :mod:`gpulayerd.runs` (this machine's files); the
services that move contents over the network are in :mod:`gpulayerd.app`.
"""
