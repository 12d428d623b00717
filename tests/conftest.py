"""Fixtures for every test.

``no_blocking_calls``: an async test fails if code of ``gpulayerd`` or ``gpulayer_tui``
makes a blocking call on its event loop (file and socket I/O, ``os.stat``,
``time.sleep``, sqlite3, ... as the ``blockbuster`` library lists them): such a call
freezes the API, the leases and the heartbeats together. Blocking work belongs in a
thread (``asyncio.to_thread``) or a subprocess.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
from blockbuster import blockbuster_ctx

SCANNED = ["gpulayerd", "gpulayer_tui"]


@pytest.fixture(autouse=True)
def no_blocking_calls(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the async test if our code blocks its event loop (see the module docstring)."""
    if not inspect.iscoroutinefunction(getattr(request, "function", None)):
        yield
        return
    with blockbuster_ctx(SCANNED) as bb:
        # Textual resolves the app's stylesheet path once, in App.__init__ (library code).
        for name in ("os.path.abspath", "os.stat"):
            bb.functions[name].can_block_in("textual/_path.py", {"_make_path_object_relative"})
        yield


# Real local accounts and gpulayer runnable by them (tests/fakes/accounts.py).
from tests.fakes.accounts import accounts, shared_python  # noqa: E402, F401
