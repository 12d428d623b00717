"""``python -m gpulayerd.cli``: the same as the ``gpulayer`` command."""

from __future__ import annotations

from gpulayerd.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
