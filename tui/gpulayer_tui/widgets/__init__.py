"""The TUI's widgets; each owns the messages it posts."""
