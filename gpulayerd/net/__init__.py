"""Networking between daemons: trust (:mod:`gpulayerd.net.identity`, :mod:`gpulayerd.net.ca`,
:mod:`gpulayerd.net.tls`).

Import the submodules directly; this package re-exports nothing, so that importing one
of them does not load the third-party libraries of the others.
"""
