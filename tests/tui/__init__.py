"""Tests of the Textual TUI: widget harnesses, the whole app on a fake daemon, snapshots,
the app on a real gpulayerd, and ``gpulayer tui`` in a real terminal (tmux)."""
