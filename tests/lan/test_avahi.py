"""A standard mDNS client (Avahi) understands what gpulayerd advertises.

h2 and h3 run gpulayerd (one cluster, mDNS on eth0); h1 runs no gpulayerd but its own
dbus-daemon and avahi-daemon, then ``avahi-browse -rtp _gpulayer._tcp``. The namespaces
share the file system, so h1's daemons run in a private mount namespace with a tmpfs
on /run: their sockets and pid files never meet anything of the root namespace's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gpulayerd.net.identity import load_or_create_identity
from tests.lan.harness import FAST_CLUSTER, Lan, netns_pids

PORT = 7171

# Runs in h1 under `unshare --mount --propagation private`; args: the node ids to wait for.
BROWSE = r"""
mount -t tmpfs -o mode=0755 gl-run /run || exit 90
mkdir -p /run/dbus /run/avahi-daemon
dbus_pid=""
cleanup() {
    avahi-daemon --kill >/dev/null 2>&1
    for _ in $(seq 1 50); do avahi-daemon --check 2>/dev/null || break; sleep 0.1; done
    if [ -n "$dbus_pid" ]; then
        kill "$dbus_pid" 2>/dev/null
        for _ in $(seq 1 50); do [ -d "/proc/$dbus_pid" ] || break; sleep 0.1; done
    fi
}
trap cleanup EXIT
dbus_pid=$(dbus-daemon --system --fork --print-pid) || exit 91
avahi-daemon --no-drop-root --no-chroot --no-rlimits --daemonize || exit 92
for _ in $(seq 1 50); do [ -S /run/avahi-daemon/socket ] && break; sleep 0.1; done
out=""
for _ in $(seq 1 30); do
    out=$(avahi-browse --resolve --terminate --parsable _gpulayer._tcp 2>&1)
    found=1
    for id in "$@"; do
        printf '%s\n' "$out" | grep -q "^=;[^;]*;IPv4;$id;_gpulayer._tcp;" || found=0
    done
    [ "$found" = 1 ] && break
    sleep 0.3
done
printf '%s\n' "$out"
"""


def _txt(field: str) -> dict[str, str]:
    """avahi-browse's TXT field (``"k=v" "k2=v2"``) as a mapping."""
    items = [t for t in field.strip().split('" "') if t]
    return dict(t.strip('"').split("=", 1) for t in items)


def test_avahi_browse_reads_our_services(lan3: Lan) -> None:
    for tool in ("avahi-browse", "avahi-daemon", "dbus-daemon"):
        assert shutil.which(tool), f"{tool} is missing (Debian: apt-get install avahi-utils avahi-daemon dbus)"
    h1, h2, h3 = lan3.hosts
    lan3.form_cluster(h2, h3)
    cluster = load_or_create_identity(h2.state_dir).cluster_id
    for h in (h2, h3):
        h.start_daemon(config=FAST_CLUSTER, extra_args=["--interface", "eth0"], log_level="INFO", wait=False)
    for h in (h2, h3):
        h.wait_daemon()
    ids = {h.node_id: h for h in (h2, h3)}
    root_run = {p: Path(p).exists() for p in ("/run/avahi-daemon", "/run/dbus/system_bus_socket", "/run/dbus/pid")}

    r = h1.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", BROWSE, "browse", *ids],
               timeout_s=60)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    resolved = {}
    for line in r.stdout.splitlines():
        fields = line.split(";")
        if fields[0] == "=" and len(fields) >= 10 and fields[2] == "IPv4":
            resolved[fields[3]] = fields
    assert set(resolved) == set(ids), f"avahi-browse saw {sorted(resolved)}, expected {sorted(ids)}:\n{r.stdout}"
    for node_id, f in resolved.items():
        host = ids[node_id]
        iface, service, domain, target, address, port = f[1], f[4], f[5], f[6], f[7], f[8]
        assert (iface, service, domain) == ("eth0", "_gpulayer._tcp", "local"), f
        assert (target, address, int(port)) == (f"{node_id}.local", host.ip, PORT), f
        txt = _txt(f[9])
        assert txt.get("id") == node_id and txt.get("cluster") == cluster, txt
        assert txt.get("v") == "1" and txt.get("port") == str(PORT) and txt.get("name") == host.hostname, txt
        assert txt.get("ep"), txt

    # Avahi and its dbus stopped with the script, and nothing of the root namespace changed.
    assert netns_pids(h1.ns) == []
    assert {p: Path(p).exists() for p in root_run} == root_run
