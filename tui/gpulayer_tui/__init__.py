"""The Textual TUI of gpulayer (talks to the local daemon only)."""
