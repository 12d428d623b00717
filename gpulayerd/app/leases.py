"""The lease tick: every second, renew what runs here, expire the owner's leases and the gang holds,
and accrue this machine's fair-share usage."""

from __future__ import annotations

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.usage import UsageService
from gpulayerd.app.owner.gang_placement import GangCoordinator
from gpulayerd.app.owner.owner import OwnerService
from gpulayerd.app.worker.member import GangMember
from gpulayerd.app.worker.worker import WorkerService

__all__ = ["LeaseLoop"]

TICK_S = 1.0


class LeaseLoop:
    """Drives the lease-related work of the worker, the owner and both sides of gangs."""

    def __init__(self, *, worker: WorkerService, owner: OwnerService, gangs: GangCoordinator, member: GangMember,
                 grace_s: float, clock: Clock, usage: UsageService | None = None) -> None:
        self._worker = worker
        self._owner = owner
        self._gangs = gangs
        self._member = member
        self._grace_s = grace_s
        self._clock = clock
        self._usage = usage

    async def loop(self) -> None:
        """Tick every second until cancelled."""
        while True:
            await self._clock.sleep(TICK_S)
            await self.tick()

    async def tick(self) -> None:
        """One tick. Renewals with peer owners run in the background (see :meth:`WorkerService.renew`)."""
        await self._worker.renew()
        await self._owner.check_leases(self._grace_s)
        self._member.expire_holds()
        await self._gangs.check_leases()
        if self._usage is not None:
            self._usage.tick()  # fair share: accrue what this machine holds now
            await self._usage.save_if_due()
