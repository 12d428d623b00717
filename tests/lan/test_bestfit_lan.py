"""Best fit across hosts (issue 31), over a real LAN of daemons: a 16 GB job goes to the host whose
free card is the smallest that fits (24 GB), not to the idle 94 GB card (H100 NVL-like) of another
host; once the 24 GB card is taken, the next one goes to the big card; and a 16 GB job submitted
on the big card's host runs on the 24 GB card of its peer.

Before, the owner offered to the least loaded peer (ties to the lowest node id): here the 24 GB host
runs a CPU job, so that rule sent the job to the big card.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpulayerd.models import Capabilities
from tests.lan.harness import FAST_CLUSTER, Host, Lan

QUIET = "INFO"
MDNS = ["--interface", "eth0"]
H100_NVL = [(95830, "9.0")]  # MiB as nvidia-smi reports it: 100.5 GB
A5000 = [(24564, "8.6")]  # 25.8 GB


def _until(owner: Host, peer: Host, ok: Callable[[Capabilities], bool], what: str, timeout_s: float = 10.0) -> None:
    """Until ``owner``'s last fetched capabilities of ``peer`` are ``ok`` (``what``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        caps = {p.node_id: p.capabilities for p in owner.api(lambda c: c.peers())}.get(peer.node_id)
        if caps is not None and ok(caps):
            return
        assert time.monotonic() < deadline, f"{owner.name} does not see {peer.name} with {what}: {caps}"
        time.sleep(0.05)


def test_a_16gb_job_goes_to_the_24gb_card_while_a_94gb_card_is_free(lan_factory: Callable[..., Lan]) -> None:
    lan = lan_factory(3)
    owner, big, small = lan.hosts
    lan.form_cluster()
    owner.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=1, log_level=QUIET, wait=False)
    big.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=2, log_level=QUIET, fake_gpus=H100_NVL,
                     wait=False)
    small.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=2, log_level=QUIET, fake_gpus=A5000,
                       wait=False)
    for h in lan.hosts:
        h.wait_daemon()
    lan.wait_cluster(timeout_s=20)
    # The small card's host is the busier one (a CPU job of its own): load alone would pick the big card.
    cpu = small.submit({"command": ["sleep", "60"]})
    small.wait_job(cpu.id, states={"running"}, timeout_s=15)
    _until(owner, small, lambda caps: caps.cpu_slots_free == 1, "1 free CPU slot")

    spec = {"command": ["sleep", "30"], "requirements": {"accelerator": "cuda", "gpu_memory_gb": 16}}
    first = owner.submit(spec)
    view = owner.wait_job(first.id, states={"running"}, timeout_s=15)
    assert [a.worker_name for a in view.attempts] == [small.hostname], view
    assert view.attempts[-1].placement is not None and list(view.attempts[-1].placement.device_indices) == [0]

    # The 24 GB card is held now: the next 16 GB job takes the big card.
    second = owner.submit(spec)
    view = owner.wait_job(second.id, states={"running"}, timeout_s=15)
    assert view.attempts[-1].worker_name == big.hostname, view
    owner.api(lambda c: c.cancel(first.id))
    owner.api(lambda c: c.cancel(second.id))

    # Best fit counts the submitting host too: a 16 GB job submitted where the 94 GB card is free
    # runs on the peer's free 24 GB card.
    owner.wait_job(second.id, timeout_s=15)
    _until(big, small, lambda caps: all(d.granted_to is None for d in caps.devices), "its card free")
    third = big.submit(spec)
    view = big.wait_job(third.id, states={"running"}, timeout_s=15)
    assert view.attempts[-1].worker_name == small.hostname, view
    big.api(lambda c: c.cancel(third.id))
