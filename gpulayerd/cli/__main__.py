"""``python -m gpulayerd.cli``: the same as the ``gpulayer`` command.

(Every ``__main__.py`` of the package is the same idea: the entry point of its package.)
"""

from __future__ import annotations

from gpulayerd.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
