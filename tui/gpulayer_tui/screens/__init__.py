"""The TUI's screens: main (Devices, Jobs, Peers, Environments), job detail, the cancel confirmation,
and help (the keys)."""
