"""This machine, as the daemon and the CLI touch it outside the job model: atomic files
(:mod:`.atomic`), private and public directories (:mod:`.privdirs`), the one-daemon-per-machine
lock (:mod:`.machinelock`), where the local socket lives (:mod:`.sockets`), service-manager
notification (:mod:`.notify`), the service files for systemd and launchd (:mod:`.service_user`,
:mod:`.service_system`), the runtime profile files (:mod:`.profile_files`, read as job-spec
requirements), file locks (:mod:`.filelocks`, fcntl's one importer), what the OS says of CPUs,
memory, interfaces and processes (:mod:`.sysinfo`, psutil's one importer), subordinate uids
(:mod:`.subids`) and the user's own settings file (:mod:`.user_config`: the notify command).

Nothing here knows peers, the store or the services; ``gpu``, ``net``, ``runs`` (its layer),
``app`` and the CLI use it.
"""
