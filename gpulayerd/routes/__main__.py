"""``python -m gpulayerd.routes [--write DOC]``: print the route tables as Markdown, or write them into DOC
(between the markers of :data:`gpulayerd.routes.BEGIN_DOC` and :data:`gpulayerd.routes.END_DOC`).

(Every ``__main__.py`` of the package is the same idea: the entry point of its package.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpulayerd.routes import markdown, splice


def main(argv: list[str] | None = None) -> int:
    """Print or write the route tables; 0 on success, 1 when the doc has no markers."""
    p = argparse.ArgumentParser(prog="python -m gpulayerd.routes",
                                description="Print the route tables (who may call what) as Markdown, or write "
                                "them into DOC between its route-table markers.")
    p.add_argument("--write", metavar="DOC", type=Path, help="replace the route tables in this Markdown file")
    args = p.parse_args(argv)
    if args.write is None:
        print(markdown())
        return 0
    try:
        args.write.write_text(splice(args.write.read_text(encoding="utf-8")), encoding="utf-8")
    except ValueError as e:
        print(f"python -m gpulayerd.routes: {args.write}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
