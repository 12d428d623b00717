"""The CLI's fast path without a daemon: what a ``gpulayer`` process imports, the submission key in
the store (unique per user, durable), the daemon-side selection of ``GET /v1/jobs``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gpulayerd.cli import main
from gpulayerd.cli.http import BadTimeout, Record, timeout_from_env
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.models.jobs_query import JobsQuery, select
from gpulayerd.store import JobRow, Store


def job(job_id: str, status: JobStatus = JobStatus.QUEUED) -> JobRow:
    return JobRow(id=job_id, status=status, spec_json="{}", lease_s=30.0,
                  submitted_at=1_700_000_000.0, updated_at=1_700_000_000.0)


_HEAVY = ("aiohttp", "pydantic", "asyncio", "packaging", "gpulayerd.models", "gpulayerd.config")

_PROBE = """
import contextlib, io, json, sys
from gpulayerd.cli import main
seen = {}
for argv in (["--help"], ["--socket", sys.argv[1], "jobs"], ["--socket", sys.argv[1], "submit", "--", "true"],
             ["--socket", sys.argv[1], "cancel", "x"], ["--socket", sys.argv[1], "users"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(argv)
    seen[argv[-1] if argv[0] == "--help" else argv[2]] = [code, err.getvalue(),
        sorted(m for m in sys.modules if m.split(".")[0] in ("aiohttp", "pydantic", "asyncio", "packaging")
               or m in ("gpulayerd.models", "gpulayerd.config"))]
print(json.dumps(seen))
"""


def test_the_cli_imports_no_aiohttp_pydantic_or_asyncio(tmp_path: Path) -> None:
    # A fresh interpreter: what `gpulayer --help`, and jobs/submit/cancel/users with no daemon, import.
    r = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path / "no.sock")], capture_output=True, text=True,
                       check=True, cwd=tmp_path)
    seen = json.loads(r.stdout)
    assert seen["--help"][0] == 0
    for command in ("jobs", "submit", "cancel", "users"):
        code, err, _ = seen[command]
        assert code == 1 and err.startswith("gpulayer: gpulayerd is not running (cannot reach gpulayerd at "), err
    assert {name: v[2] for name, v in seen.items()} == {n: [] for n in seen}, f"imported: {seen} ({_HEAVY})"


def test_timeout_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPULAYER_TIMEOUT", raising=False)
    assert timeout_from_env() == 30.0
    for raw, want in (("2.5", 2.5), ("", 30.0), (" 60 ", 60.0)):
        monkeypatch.setenv("GPULAYER_TIMEOUT", raw)
        assert timeout_from_env() == want, raw
    for raw in ("0", "-1", "soon", "nan", "1e9"):  # never silently 30 s
        monkeypatch.setenv("GPULAYER_TIMEOUT", raw)
        with pytest.raises(BadTimeout, match="GPULAYER_TIMEOUT="):
            timeout_from_env()


def test_a_bad_timeout_is_a_usage_error_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setenv("GPULAYER_TIMEOUT", "abc")
    assert main(["--socket", str(tmp_path / "none.sock"), "jobs"]) == 2  # before any connection
    err = capsys.readouterr().err
    assert err.startswith("gpulayer: GPULAYER_TIMEOUT='abc' is not a number of seconds: give one above 0"), err


def test_record_reads_keys_as_attributes_and_dumps_as_json() -> None:
    r = json.loads('{"id": "j1", "spec": {"user": "alice"}, "attempts": [{"gang": []}]}', object_hook=Record)
    assert (r.id, r.spec.user, r.attempts[0].gang) == ("j1", "alice", [])
    with pytest.raises(AttributeError):
        _ = r.name
    assert json.dumps(r) == '{"id": "j1", "spec": {"user": "alice"}, "attempts": [{"gang": []}]}'


@pytest.mark.asyncio
async def test_a_submission_key_is_unique_per_user_and_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with await Store.open(path) as s:
        first = await s.jobs.insert_job(job("a1"), "submitted", key=("alice", "k1"))
        again = await s.jobs.insert_job(job("a2"), "submitted", key=("alice", "k1"))
        assert (first.id, again.id, again.seq) == ("a1", "a1", first.seq)
        bob = await s.jobs.insert_job(job("b1"), "submitted", key=("bob", "k1"))
        assert bob.id == "b1"
    async with await Store.open(path) as s:
        later = await s.jobs.insert_job(job("a3"), "submitted", key=("alice", "k1"))
        assert later.id == "a1"
        assert [r.id for r in await s.jobs.list_jobs()] == ["a1", "b1"]
        assert [len(await s.jobs.events(i)) for i in ("a1", "b1")] == [1, 1]  # one "submitted" each
        assert await s.integrity_check() == "ok"


def test_select_keeps_unfinished_jobs_and_the_latest_finished() -> None:
    rows = [replace(job(f"j{i}", status), name=user) for i, (status, user) in enumerate([
        (JobStatus.SUCCEEDED, "alice"), (JobStatus.QUEUED, "bob"), (JobStatus.FAILED, "alice"),
        (JobStatus.RUNNING, "alice"), (JobStatus.REJECTED, "bob"), (JobStatus.CANCELLED, "alice")])]

    def ids(q: JobsQuery) -> list[str]:
        return [r.id for r in select(rows, q, lambda r: r.name or "", lambda r: r.status.value)]

    q = JobsQuery(finished=2)
    assert ids(q) == ["j1", "j3", "j4", "j5"] and q.left_out == 2
    q = JobsQuery(user="alice", finished=1)
    assert ids(q) == ["j3", "j5"] and q.left_out == 2
    q = JobsQuery(finished=0, limit=1)
    assert ids(q) == ["j3"] and q.left_out == 5
    q = JobsQuery(user="carol")
    assert ids(q) == [] and q.left_out == 0


# --- start-up: the chosen command's module only, no wcwidth for ASCII-ish tables --------------------------

_JOB = {"id": "m8qgmtbntdp5", "name": "train", "submitted_by": "alice", "owner": "n1", "owner_name": "ws-1",
        "status": "queued", "attempt": 0, "holder": None, "holder_name": None, "reason": "GPU 0 held — by bob…",
        "reason_code": "Resources", "exit_code": None, "submitted_at": 1_700_000_000.0, "spec": {"user": "alice"},
        "where_node": None, "where_name": None, "where_devices": [], "where_hosts": []}


def _serve_jobs(path: Path, jobs: list[dict[str, object]]) -> None:
    """A stand-in daemon on unix socket ``path`` (a thread): GET ``/v1/jobs`` answers ``jobs``, a POST (submit)
    the first of them, anything else []."""
    import socket
    import threading

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(4096)
                method, target = head.split(b" ")[:2]
                if method == b"POST":
                    while len(head.partition(b"\r\n\r\n")[2]) < int(head.split(b"Content-Length: ")[1].split(b"\r")[0]):
                        head += conn.recv(4096)
                answer = jobs[0] if method == b"POST" else jobs if target.startswith(b"/v1/jobs") else []
                body = json.dumps(answer).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    threading.Thread(target=loop, daemon=True).start()


_STARTUP = """
import contextlib, io, json, sys
from gpulayerd.cli import main
out = {}
for argv in (["--help"], ["--socket", sys.argv[1], "jobs"], ["--socket", sys.argv[1], "submit", "--", "true"]):
    before = set(sys.modules)
    with contextlib.redirect_stdout(io.StringIO()) as o, contextlib.redirect_stderr(io.StringIO()) as e:
        code = main(argv)
    out[argv[2] if len(argv) > 1 else "--help"] = [code, o.getvalue(), e.getvalue(), sorted(set(sys.modules) - before)]
print(json.dumps(out))
"""


def test_help_and_jobs_import_only_what_they_use(tmp_path: Path) -> None:
    _serve_jobs(tmp_path / "d.sock", [_JOB, {**_JOB, "id": "m8qgmtf8q1vv", "status": "succeeded",
                                             "reason": "exited 0", "reason_code": "", "exit_code": 0}])
    r = subprocess.run([sys.executable, "-c", _STARTUP, str(tmp_path / "d.sock")], capture_output=True, text=True,
                       check=True, cwd=tmp_path, env={**os.environ, "COLUMNS": "100"}, timeout=60)
    seen = json.loads(r.stdout)
    code, out, _, new = seen["--help"]
    assert code == 0 and "  jobs           the job queue of every user" in out
    assert [m for m in new if m.startswith("gpulayerd")] == ["gpulayerd.text"]  # no command module
    code, out, err, new = seen["jobs"]
    assert (code, err) == (0, ""), err
    # alice's job read by another account: whose it is shows (the USER column)
    assert out.splitlines()[0].split() == ["ID", "NAME", "USER", "STATE", "WHERE", "AGE", "REASON"]
    cells = out.splitlines()[1].split()
    del cells[5]  # AGE
    assert cells == ["m8qgmtbntdp5", "train", "alice", "queued", "—", "Resources:", "GPU", "0", "held", "—", "by", "bob…"]
    # (gpulayerd.core.job_facts, the job states and whose a job is, imports nothing: it may come)
    heavy = ("aiohttp", "pydantic", "asyncio", "wcwidth", "socket", "shutil", "typing", "gpulayerd.models",
             "gpulayerd.core.types", "gpulayerd.core.matching", "gpulayerd.core.protocol", "gpulayerd.cli.devices",
             "gpulayerd.cli.cluster", "gpulayerd.cli.service")
    assert [m for m in new if m.startswith(heavy)] == []
    assert "gpulayerd.cli.jobs" in new and "gpulayerd.cli.http" in new
    code, out, err, new = seen["submit"]
    assert (code, out, err) == (0, "submitted job m8qgmtbntdp5 (train): queued\n", "")
    assert [m for m in new if m.startswith((*heavy, "typing", "uuid"))] == []


def test_the_lazy_parsers_print_what_the_full_parser_prints() -> None:
    import argparse

    from gpulayerd import cli

    def subs(p: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
        return next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))

    full = cli.build_parser()
    assert [name for name, _, _ in cli.COMMANDS] == list(subs(full).choices)
    assert cli._parser(()).format_help() == full.format_help()  # the help lines of COMMANDS are the modules'
    for name, _, module in cli.COMMANDS:
        assert subs(cli._parser([module])).choices[name].format_help() == subs(full).choices[name].format_help()


def test_the_narrow_characters_are_one_cell_for_wcwidth_too() -> None:
    from wcwidth import wcswidth, wcwidth

    from gpulayerd import text

    assert len(text._NARROW) > 1000 and {"—", "…", "✓", "✗", "é", "≈", "│"} <= text._NARROW
    assert [ch for ch in sorted(text._NARROW) if wcwidth(ch) != 1] == []
    for value in ("Resources: GPU 0 held — by bob…", "日本語 — x", "e\u0301t\u00e9", "\u00a0nbsp", "ok ✓"):
        assert text.width(value) == wcswidth(value), value


def test_terminal_columns_answers_what_shutil_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from gpulayerd.text import terminal_columns

    for columns in ("120", "0", "wide", ""):
        monkeypatch.setenv("COLUMNS", columns)
        assert terminal_columns() == shutil.get_terminal_size().columns, columns
