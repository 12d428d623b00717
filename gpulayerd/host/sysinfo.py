"""What the operating system says about this machine and its processes: CPUs, memory, network
interfaces, processes. The one importer of psutil (a contract in pyproject.toml); the rest of the
daemon reads these names from here.
"""

from __future__ import annotations

import psutil

__all__ = ["STATUS_ZOMBIE", "AccessDenied", "Error", "NoSuchProcess", "Process", "boot_time", "cpu_count",
           "net_if_addrs", "net_if_stats", "process_iter", "virtual_memory"]

Process = psutil.Process
"""A process by pid (its creation time, status, children, ids, command line)."""
Error = psutil.Error
"""Any psutil error: the process is gone, access denied, a zombie."""
NoSuchProcess = psutil.NoSuchProcess
AccessDenied = psutil.AccessDenied
STATUS_ZOMBIE = psutil.STATUS_ZOMBIE
process_iter = psutil.process_iter
boot_time = psutil.boot_time
cpu_count = psutil.cpu_count
virtual_memory = psutil.virtual_memory
net_if_addrs = psutil.net_if_addrs
net_if_stats = psutil.net_if_stats
