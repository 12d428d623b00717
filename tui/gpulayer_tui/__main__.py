"""``python -m gpulayer_tui``: the gpulayer terminal UI (see :func:`gpulayer_tui.launch.main`)."""

from __future__ import annotations

from gpulayer_tui.launch import main

if __name__ == "__main__":
    raise SystemExit(main())
