# Sourced by scripts/test: the system tools the test suite drives for real, from Debian's
# packages. Installed only when missing, and only where we are root with apt-get (CI is);
# elsewhere the tests that need a tool fail with a message naming it.
#   systemd-analyze (systemd)      unit file verification
#   ip, nft, ping (iproute2, nftables, iputils-ping)   the network-namespace LAN
#   avahi-browse, avahi-daemon, dbus-daemon            a standard mDNS client reads our records
#   tmux                                               the TUI in a real terminal
#   slurmctld, slurmd, sbatch, munged (slurmctld, slurmd, slurm-client, munge)   a one-node Slurm
need=()
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)
command -v avahi-browse >/dev/null 2>&1 || need+=(avahi-utils)
command -v avahi-daemon >/dev/null 2>&1 || need+=(avahi-daemon)
command -v dbus-daemon >/dev/null 2>&1 || need+=(dbus)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
command -v slurmctld >/dev/null 2>&1 || need+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || need+=(slurmd)
command -v sbatch >/dev/null 2>&1 || need+=(slurm-client)
command -v munged >/dev/null 2>&1 || need+=(munge)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing Debian packages for the tests: ${need[*]}"
    log="${VENV:-/tmp}/apt-install.log"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${need[@]}"; } >"$log" 2>&1; then
      tail -20 "$log" >&2
      echo "apt-get install ${need[*]} failed (log: $log); the tests that need them will fail" >&2
    fi
  else
    echo "missing tools for some tests (install these Debian packages as root): ${need[*]}" >&2
  fi
fi
