"""The local API (unix socket), the peer API (mutual TLS) and their clients: the HTTP layer, aiohttp's
one importing package. :mod:`.server` and :mod:`.unixsite` (the local API and its socket),
:mod:`.peer` and :mod:`.tlssite` (the peer API, its router and listener), :mod:`.enroll` (the
enrollment listener), :mod:`.client` (DaemonClient: the TUI's, the tests' and ``gpulayer service
status``'s)."""
