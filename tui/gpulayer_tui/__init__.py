"""The Textual TUI of gpulayer (talks to the local daemon only); ``serve`` shows it read-only in browsers
(``gpulayer tui --serve``), ``readonly`` is that read-only board."""
