"""This machine, as the daemon and the CLI touch it outside the job model: atomic files
(:mod:`.atomic`), private and public directories (:mod:`.privdirs`), the one-daemon-per-machine
lock (:mod:`.machinelock`), where the local socket lives (:mod:`.sockets`), service-manager
notification (:mod:`.notify`), the service files for systemd and launchd (:mod:`.service_user`,
:mod:`.service_system`) and the runtime profile files (:mod:`.profile_files`).

Nothing here knows jobs, peers or the store; ``app`` and the CLI use it.
"""
