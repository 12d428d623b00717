"""The user's own gpulayer settings, read by the CLI as the user: ``config.toml`` in platformdirs' user
config directory (``~/.config/gpulayer/config.toml`` on Linux; ``$GPULAYER_USER_CONFIG`` overrides).

Keys read today: ``notify``, the command a job's ``--notify`` runs (a list of strings, e.g.
``notify = ["notify-send", "gpulayer"]`` or ``["sh", "-c", "mail -s \\"$GPULAYER_JOB_STATE\\" me < /dev/null"]``):
the daemon that owns the job runs it as the user, with the job's id, name, state and exit code in
``GPULAYER_JOB_ID``, ``GPULAYER_JOB_NAME``, ``GPULAYER_JOB_STATE`` and ``GPULAYER_EXIT_CODE``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["NOTIFY_EVENTS", "notify_policy", "user_config_path"]

NOTIFY_EVENTS = ("start", "end", "fail")
"""The events of ``--notify`` (as :data:`gpulayerd.models.policy.NOTIFY_EVENTS`, without importing the models)."""


def user_config_path() -> Path:
    """``$GPULAYER_USER_CONFIG``, else ``config.toml`` in the user config directory."""
    override = os.environ.get("GPULAYER_USER_CONFIG")
    if override:
        return Path(override)
    from platformdirs import user_config_dir

    return Path(user_config_dir("gpulayer", appauthor=False)) / "config.toml"


def notify_policy(policy: dict[str, object]) -> None:
    """Check ``policy["notify"]`` (a comma list or a list) and add the user's ``notify_command``.

    Raises:
        ValueError: an unknown event (naming the allowed ones), or no usable ``notify`` command in the
            user's config file (naming the file and the key).
    """
    raw = policy.get("notify")
    if raw in (None, "", []):
        return
    events = [x.strip() for x in raw.split(",") if x.strip()] if isinstance(raw, str) else raw
    if not isinstance(events, list) or not all(isinstance(x, str) for x in events):
        raise ValueError("notify: a comma-separated list of events: start, end, fail")
    bad = [x for x in events if x not in NOTIFY_EVENTS]
    if bad:
        raise ValueError(f"--notify: unknown event {', '.join(map(repr, bad))}; allowed: {', '.join(NOTIFY_EVENTS)}")
    policy["notify"] = events
    if os.geteuid() == 0:
        print("gpulayer: --notify: notify commands never run as root: this job's will not run (submit it as "
              "your own account)", file=sys.stderr)
    if policy.get("notify_command"):
        return
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    path = user_config_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"--notify: no notify command: put `notify = [\"COMMAND\", \"ARG\"]` in {path}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"--notify: cannot read {path}: {e}") from None
    command = data.get("notify")
    if not isinstance(command, list) or not command or not all(isinstance(x, str) and x for x in command):
        raise ValueError(f"--notify: `notify` in {path} must be a non-empty list of strings (a command and "
                         "its arguments)")
    policy["notify_command"] = command
