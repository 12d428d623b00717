"""The TUI's screens: main (Devices, Jobs, Peers), job detail, and the cancel confirmation."""
