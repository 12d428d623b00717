"""This daemon as a member of the lab's cluster: membership and heartbeats (:mod:`.node`), trust
at run time (revocations, the enrollment listener, certificate renewal: :mod:`.trust`) and the
transport that answers calls to this node itself without the network (:mod:`.self_first`).

Uses ``app.common`` and this machine's worker view (``app.worker.machine``).
"""
