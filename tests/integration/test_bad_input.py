"""Bad job specs: ``gpulayer submit`` exits 2 naming the field, and nothing is stored.

One CPU daemon serves the whole module. Each case counts the daemon's jobs (the API's
unfiltered list, what ``gpulayer jobs --json --all`` prints) and its run directories
before and after; ``test_the_count_sees_a_stored_job`` shows the count does move when
a job is stored, and ``test_cli_job_list_matches_the_api`` checks the CLI's own listing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayerd.api.client import ApiRequestError

from .conftest import Daemon

MISSING_DIR = "/nonexistent-gpulayer-test/dir"

# (case id, TOML text, substrings the error message must contain)
TOML_CASES = [
    ("malformed", 'command = ["true"\n', ["malformed TOML", "job.toml"]),
    ("unknown-field", 'command = ["true"]\ncolour = "red"\n', ["colour: unknown field"]),
    ("unknown-nested-field", 'command = ["true"]\n[requirements]\ngpu_type = "a100"\n',
     ["requirements.gpu_type: unknown field"]),
    ("wrong-type-gpu-count", 'command = ["true"]\n[requirements]\naccelerator = "cuda"\ngpu_count = "two"\n',
     ["requirements.gpu_count"]),
    ("wrong-type-command", "command = 5\n", ["command"]),
    ("wrong-type-env", 'command = ["true"]\n[env]\nA = 1\n', ["env.A"]),
    ("wrong-type-nproc", 'command = ["true"]\n[distributed]\nnproc_per_node = 1.5\n',
     ["distributed.nproc_per_node"]),
    ("no-command", 'name = "x"\n', ["command: required field is missing"]),
    ("empty-command", "command = []\n", ["command", "must not be empty"]),
    ("missing-workdir", f'command = ["true"]\nworkdir = "{MISSING_DIR}"\n', ["workdir", MISSING_DIR]),
    ("missing-relative-workdir", 'command = ["true"]\nworkdir = "no/such/dir"\n', ["workdir", "no/such/dir"]),
    ("unknown-framework", 'command = ["true"]\n[requirements.frameworks]\ntensorflo = ">=2"\n',
     ["requirements.frameworks", "unknown framework 'tensorflo'"]),
    ("bad-framework-specifier", 'command = ["true"]\n[requirements.frameworks]\ntorch = ">>2"\n',
     ["requirements.frameworks", "'>>2'"]),
    ("unknown-accelerator", 'command = ["true"]\n[requirements]\naccelerator = "tpu"\n',
     ["requirements.accelerator", "'tpu'"]),
    # Text that cannot reach exec: refused at submit, not when the job starts (issue 24).
    ("nul-in-program", 'command = ["tr\\u0000ue"]\n', ["command: item 0 (the program) must not contain a NUL byte"]),
    ("nul-in-argument", 'command = ["echo", "a\\u0000b"]\n', ["command: item 1 (an argument) must not contain a NUL byte"]),
    ("nul-in-env-value", 'command = ["true"]\n[env]\nTOKEN = "x\\u0000y"\n',
     ["env", "the value of 'TOKEN' must not contain a NUL byte"]),
    ("nul-in-env-name", 'command = ["true"]\n[env]\n"A\\u0000B" = "1"\n',
     ["env", "is not a valid environment variable name"]),
    ("escape-in-workdir", 'command = ["true"]\nworkdir = "/tmp/\\u001b[2Jx"\n', ["workdir", "/tmp/\\x1b[2Jx"]),
    ("cpu-with-gpus", 'command = ["true"]\n[requirements]\ngpu_count = 2\n', ["gpu_count"]),
]

# (case id, submit arguments, substrings the error message must contain)
FLAG_CASES = [
    ("no-command", [], ["command"]),
    ("empty-command", ["--"], ["command"]),
    ("missing-workdir", ["--workdir", MISSING_DIR, "--", "true"], ["workdir", MISSING_DIR]),
    ("unknown-framework", ["--framework", "tensorflo>=2", "--", "true"],
     ["requirements.frameworks", "tensorflo"]),
    ("invalid-framework", ["--framework", "torch>>2", "--", "true"], ["--framework", "torch>>2"]),
    ("wrong-type-gpus", ["--accelerator", "cuda", "--gpus", "two", "--", "true"], ["--gpus", "two"]),
    ("unknown-accelerator", ["--accelerator", "tpu", "--", "true"], ["--accelerator", "tpu"]),
    ("env-without-equals", ["--env", "NOVALUE", "--", "true"], ["--env", "NOVALUE"]),
    ("bad-compute-capability", ["--accelerator", "cuda", "--min-cc", "abc", "--", "true"],
     ["min_cuda_compute_capability"]),
    ("gpu-memory-on-cpu", ["--gpu-memory-gb", "8", "--", "true"], ["gpu_memory_gb"]),
    ("negative-retries", ["--retries", "-1", "--", "true"], ["policy.retries"]),
    ("short-lease", ["--lease-s", "0.1", "--", "true"], ["policy.lease_s"]),
]


def stored(d: Daemon) -> tuple[int, set[str]]:
    """How many jobs the daemon lists (every status) and which run directories exist."""
    return len(d.call(lambda c: c.jobs())), d.job_ids_on_disk()


def assert_usage_error(d: Daemon, args: list[str], words: list[str], cwd: Path | None = None) -> None:
    before = stored(d)
    r = d.cli("submit", *args, cwd=cwd)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == "" and "\x1b" not in r.stderr and "\0" not in r.stderr  # control characters made visible
    for w in words:
        assert w in r.stderr, f"{w!r} not in: {r.stderr}"
    assert stored(d) == before


@pytest.mark.parametrize(("text", "words"), [c[1:] for c in TOML_CASES], ids=[c[0] for c in TOML_CASES])
def test_bad_spec_file_exits_2_and_stores_nothing(cpu_daemon: Daemon, tmp_path: Path, text: str,
                                                   words: list[str]) -> None:
    spec = tmp_path / "job.toml"
    spec.write_text(text, encoding="utf-8")
    assert_usage_error(cpu_daemon, ["-f", str(spec)], words)


@pytest.mark.parametrize(("args", "words"), [c[1:] for c in FLAG_CASES], ids=[c[0] for c in FLAG_CASES])
def test_bad_submit_flags_exit_2_and_store_nothing(cpu_daemon: Daemon, args: list[str], words: list[str]) -> None:
    assert_usage_error(cpu_daemon, args, words)


def test_spec_file_plus_command_conflict(cpu_daemon: Daemon, tmp_path: Path) -> None:
    spec = tmp_path / "job.toml"
    spec.write_text('command = ["true"]\n', encoding="utf-8")
    assert_usage_error(cpu_daemon, ["-f", str(spec), "--", "echo", "hi"], ["-f", "command", "not both"])


def test_missing_spec_file(cpu_daemon: Daemon, tmp_path: Path) -> None:
    assert_usage_error(cpu_daemon, ["-f", str(tmp_path / "nope.toml")], ["nope.toml", "cannot read"])


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"command": ["true"], "workdir": "relative/dir"}, ["workdir", "absolute"]),
        ({"command": ["true"]}, ["workdir"]),
        ({"command": ["true"], "workdir": "/tmp", "colour": "red"}, ["colour: unknown field"]),
        ({"workdir": "/tmp"}, ["command: required field is missing"]),
        ({"command": ["true"], "workdir": "/tmp", "requirements": {"gpu_count": "two"}},
         ["requirements.gpu_count"]),
        ({"command": ["echo", "a\0b"], "workdir": "/tmp"}, ["command", "NUL"]),
        ({"command": ["true"], "workdir": "/tmp", "env": {"K": "v\0"}}, ["env", "'K'", "NUL"]),
        ({"command": ["echo", "x" * 200_000], "workdir": "/tmp"},
         ["command: item 1 (an argument) is 200000 bytes long: at most 131071 bytes"]),
        ({"command": ["true"], "workdir": "/tmp", "env": {"BIG": "y" * 131_068}},
         ["the value of 'BIG' is 131072 bytes long"]),
        ({"command": ["echo", *(["z" * 100_000] * 10)], "workdir": "/tmp"},
         ["command and env together are", "at most 1000000 bytes"]),
    ],
    ids=["relative-workdir", "no-workdir", "unknown-field", "no-command", "wrong-type", "nul-argument",
         "nul-env-value", "argument-too-long", "env-entry-too-long", "argv-too-long"],
)
def test_api_rejects_bad_specs_and_stores_nothing(cpu_daemon: Daemon, spec: dict[str, object],
                                                  words: list[str]) -> None:
    d = cpu_daemon
    before = stored(d)
    known = {j.id for j in d.call(lambda c: c.jobs())}
    try:
        with pytest.raises(ApiRequestError) as info:
            d.call(lambda c: c.submit(spec, submitted_by="test"))
        assert info.value.status == 400
        assert info.value.code in ("invalid_spec", "bad_request")
        for w in words:
            assert w in str(info.value), str(info.value)
        assert stored(d) == before
    finally:  # a wrongly stored job must not run, nor spoil the other cases
        for job in d.call(lambda c: c.jobs()):
            if job.id not in known and job.status in ("queued", "claimed", "running"):
                d.call(lambda c, i=job.id: c.cancel(i))


def test_a_path_with_a_nul_byte_is_refused_and_nothing_stored(cpu_daemon: Daemon) -> None:
    d = cpu_daemon
    before = stored(d)
    with pytest.raises(ApiRequestError) as info:
        d.call(lambda c: c.submit({"command": ["true"], "workdir": "/tmp"}, path="/usr/bin\0/bin"))
    assert (info.value.status, "path: must not contain a NUL byte" in str(info.value)) == (400, True), info.value
    assert stored(d) == before


def test_the_count_sees_a_stored_job(cpu_daemon: Daemon) -> None:
    d = cpu_daemon
    before, _ = stored(d)
    job_id = d.submit("--", "true")
    assert stored(d)[0] == before + 1
    assert d.wait_status(job_id, {"succeeded"}).exit_code == 0


def test_cli_job_list_matches_the_api(cpu_daemon: Daemon) -> None:
    listed = cpu_daemon.all_jobs()
    assert sorted(j["id"] for j in listed) == sorted(j.id for j in cpu_daemon.call(lambda c: c.jobs()))
