"""``Machine.caps_digest`` (in every heartbeat and reply) is kept between calls, and still changes
whenever what peers see changes: the capabilities replaced, a run started or ended, a device grant
written to the store (signalled after the write), an account found missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpulayerd.models import DeviceModel
from tests.fakes.daemons import OWNER, Lab
from tests.unit.test_reasons_scheduler import _caps


@pytest.mark.asyncio
async def test_the_digest_is_kept_and_changes_whenever_what_peers_see_changes(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    try:
        d = await lab.add("owner", OWNER, cpu_slots=2)
        machine = d.services.machine
        caps = _caps(d, 1, lab)
        machine.use_capabilities(caps)
        first = machine.caps_digest()
        assert machine.caps_digest() == first
        assert machine.caps_digest() == first
        more = caps.model_copy(update={"devices": [*caps.devices, DeviceModel(
            accelerator="cuda", index=1, uuid="GPU-1", name="RTX 4090", memory_total_bytes=24 * 10**9,
            compute_capability="8.9", execution_supported=True)]})
        machine.use_capabilities(more)
        second = machine.caps_digest()
        assert second != first

        ledger: Any = machine._ledger
        ledger._runs[("job1", 1)] = object()  # a run started (its entry's contents are not read)
        third = machine.caps_digest()
        assert third not in (first, second)
        del ledger._runs[("job1", 1)]
        assert machine.caps_digest() == second
        # A run's end lets its ledger entry go before its grant's store write; the write's signal comes
        # after it: a peer that fetched in between (grant still stored) must fetch again.
        d.services.signals.devices_changed()
        fourth = machine.caps_digest()
        assert fourth not in (first, second, third)
        assert machine.caps_digest() == fourth
        second = fourth

        machine.accounts._exists = lambda name: False
        assert not await machine.accounts.exists("ghost")
        assert machine.caps_digest() not in (first, second, third)
    finally:
        await lab.close()
