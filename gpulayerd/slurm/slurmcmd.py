"""THE runner of Slurm's client commands: each with a hard timeout, ``[slurm] env`` added, its stderr in
the error (through :func:`gpulayerd.gpu.command.run_command`, subprocess's one importer)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpulayerd.gpu.command import CommandRunner, decisive_line, run_command
from gpulayerd.slurm.outputs import (
    JOB_FORMAT,
    NODE_FORMAT,
    SACCT_FORMAT,
    SlurmJob,
    SlurmNode,
    parse_nodes_json,
    parse_nodes_lines,
    parse_sacct,
    parse_scontrol_job,
    parse_squeue,
)

__all__ = ["SlurmCommands", "SlurmError"]


class SlurmError(Exception):
    """A Slurm command failed, timed out or is missing; the message carries its own words.

    ``refusal``: Slurm answered and refused (exit non-zero), as opposed to not answering or missing."""

    def __init__(self, message: str, refusal: bool = False) -> None:
        super().__init__(message)
        self.refusal = refusal


class SlurmCommands:
    """``sinfo``, ``squeue``, ``scontrol``, ``sacct``, ``sbatch`` and ``scancel``, each bounded by ``timeout_s``.

    Args:
        timeout_s: the hard limit of one command.
        env: variables every command gets (``SLURM_CONF``).
        runner: how commands run (tests pass their own).
    """

    def __init__(self, timeout_s: float, env: Mapping[str, str] | None = None,
                 runner: CommandRunner = run_command) -> None:
        self._timeout_s = timeout_s
        self._env = dict(env or {})
        self._runner = runner
        self._json_nodes: bool | None = None  # does this sinfo answer --json? (asked once)
        self.accounting_off = False  # sacct said accounting is disabled here (asked no more)
        self.last_stderr = ""  # the last command's standard error (Slurm's words beside a JSON answer's errors)

    def run(self, argv: Sequence[str]) -> str:
        """``argv``'s standard output.

        Raises:
            SlurmError: it is missing, timed out or exited non-zero (``sbatch: error: ...``).
        """
        r = self._runner(argv, self._timeout_s, self._env)
        self.last_stderr = r.stderr or ""
        if r.not_found:
            raise SlurmError(f"{argv[0]}: not found (is Slurm's client installed here?)")
        if r.timed_out:
            raise SlurmError(f"{argv[0]} did not answer within {self._timeout_s:g} s")
        if r.returncode != 0:
            words = decisive_line((r.stderr or r.stdout).strip().splitlines()) or f"exit {r.returncode}"
            unreachable = "unable to contact" in words.lower() or "timed out" in words.lower()
            raise SlurmError(words if words.startswith(argv[0]) else f"{argv[0]}: {words}", refusal=not unreachable)
        return r.stdout

    def nodes(self) -> list[SlurmNode]:
        """Every node ``sinfo`` shows, with its partitions (``sinfo --json`` where it answers, else ``-o``).

        Raises:
            SlurmError: sinfo failed (slurmctld unreachable: its words) or its answer does not parse.
        """
        if self._json_nodes is not False:
            try:
                nodes = parse_nodes_json(self.run(["sinfo", "--json"]))
                self._json_nodes = True
                return nodes
            except (SlurmError, ValueError) as e:
                if self._json_nodes:  # this sinfo answers --json: its errors are Slurm's (slurmctld unreachable)
                    words = decisive_line(self.last_stderr.strip().splitlines())
                    raise SlurmError(f"sinfo: {words or e}") from e
                self._json_nodes = False
        try:
            return parse_nodes_lines(self.run(["sinfo", "-N", "-h", "-o", NODE_FORMAT]))
        except ValueError as e:
            raise SlurmError(str(e)) from e

    def queue(self) -> list[SlurmJob]:
        """The jobs ``squeue`` shows (pending and running; those of every user it lets us see)."""
        return parse_squeue(self.run(["squeue", "-h", "-o", JOB_FORMAT]))

    def job(self, job_id: str) -> SlurmJob | None:
        """Job ``job_id`` as ``scontrol -o show job`` says (ended ones too, while Slurm keeps them);
        None when Slurm no longer knows it."""
        try:
            return parse_scontrol_job(self.run(["scontrol", "-o", "show", "job", job_id]))
        except SlurmError as e:
            if "Invalid job id" in str(e):
                return None
            raise

    def accounted(self, job_id: str) -> SlurmJob | None:
        """Job ``job_id`` as ``sacct`` records it where Slurm accounting runs; None where it is disabled (asked
        once: ``Slurm accounting storage is disabled``) or sacct has no record of it.

        Raises:
            SlurmError: sacct failed otherwise (slurmdbd unreachable: its words).
        """
        if self.accounting_off:
            return None
        try:
            return parse_sacct(self.run(["sacct", "-n", "-P", "-X", "-o", SACCT_FORMAT, "-j", job_id]), job_id)
        except SlurmError as e:
            if "accounting storage is disabled" in str(e).lower():
                self.accounting_off = True
                return None
            raise

    def final(self, job_id: str, seen: SlurmJob | None) -> SlurmJob | None:
        """The record an ended job's end is taken from: ``sacct``'s where accounting runs and has it ended,
        else ``seen`` (``scontrol``'s, while Slurm still knows the job; None: neither knows it)."""
        try:
            acct = self.accounted(job_id)
        except SlurmError:
            acct = None
        return acct if acct is not None and acct.ended else seen

    def submit(self, argv: Sequence[str]) -> str:
        """Run ``sbatch --parsable ...``; Slurm's job id.

        Raises:
            SlurmError: sbatch refused it (its words: ``sbatch: error: Invalid account ...``).
        """
        out = self.run(argv).strip()
        job_id = out.split(";")[0].strip()
        if not job_id.isdigit():
            raise SlurmError(f"sbatch: unexpected answer {out!r}")
        return job_id

    def cancel(self, job_id: str, signal: str = "") -> None:
        """``scancel [--signal NAME --full] ID``."""
        self.run(["scancel", *([f"--signal={signal}", "--full"] if signal else []), job_id])
