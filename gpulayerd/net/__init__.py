"""Networking between daemons: trust (:mod:`.identity`, :mod:`.ca`, :mod:`.enroll`, :mod:`.joining`,
:mod:`.revocation`: the only importers of cryptography), mutual TLS (:mod:`.tls`), connection
limits (:mod:`.job_policy`), discovery (:mod:`.mdns`, zeroconf's one importer; :mod:`.announcement`,
:mod:`.interfaces`), membership (:mod:`.peers`), the peer messages (:mod:`.wire`) and the peer
routes bound to them with the protocols services reach peers through (:mod:`.transport`).

Import the submodules directly; this package re-exports nothing, so that importing one
of them does not load the third-party libraries of the others.
"""
