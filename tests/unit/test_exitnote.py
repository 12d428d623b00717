"""The exit record a watchdog keeps in memory on a full disk: backoff, and the disk-free channel to the daemon."""

from __future__ import annotations

import itertools
import os
import sys
import threading
import uuid

import pytest

from gpulayerd.runs.exitnote import ExitNote, ask, retry_delays, socket_name

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets are Linux's")


def test_retry_delays_double_up_to_the_cap_and_never_end() -> None:
    assert list(itertools.islice(retry_delays(0.05, 1.0), 7)) == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


@linux_only
def test_the_record_is_served_to_the_watchdogs_asker_and_the_ack_is_seen() -> None:
    start = uuid.uuid4().int % 10**9  # a name of this test's own
    record = {"exit_code": 1, "reason": "exited", "detail": "the job exited with code 1"}
    note = ExitNote(socket_name(os.getpid(), start), record)
    assert note.listening
    def serve_twice() -> None:
        for _ in range(2):
            note.serve(10.0)

    served = threading.Thread(target=serve_twice)
    served.start()
    try:
        assert ask(os.getpid(), start) == record  # a plain look: the note keeps waiting
        assert ask(os.getpid(), start, ack=True) == record
    finally:
        served.join(10)
        note.close()
    assert note.recorded


@linux_only
def test_a_record_from_another_pid_than_the_watchdogs_is_not_trusted() -> None:
    start = uuid.uuid4().int % 10**9
    # Someone bound the name of watchdog pid 1 (this process, not pid 1): the daemon ignores it.
    note = ExitNote(socket_name(1, start), {"exit_code": 0, "reason": "exited"})
    served = threading.Thread(target=note.serve, args=(10.0,))
    served.start()
    try:
        assert ask(1, start) is None
    finally:
        served.join(10)
        note.close()
    assert not note.recorded
    assert ask(os.getpid(), start) is None  # nobody serves that name: no record, at once


def test_a_name_already_taken_leaves_the_note_closed() -> None:
    if not sys.platform.startswith("linux"):
        assert socket_name(os.getpid(), 1) is None
        return
    name = socket_name(os.getpid(), uuid.uuid4().int % 10**9)
    first = ExitNote(name, {})
    try:
        second = ExitNote(name, {})
        assert first.listening and not second.listening
    finally:
        first.close()
