"""Job specs as users write them (TOML files, CLI flags, API bodies), validated with pydantic.

Job specs reject unknown fields, naming them. ``gpu_memory_gb`` is decimal GB (10^9 bytes).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpulayerd.core.arrays import MAX_INDEX, ArrayError, parse_array
from gpulayerd.core.dependencies import DependencyError, parse_after
from gpulayerd.core.job_policy import format_duration
from gpulayerd.core.types import GB, Accelerator, DistributedRequest, JobRequest, MemoryKind
from gpulayerd.models.policy import PolicyModel
from gpulayerd.models.snapshots import ShipField

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = [
    "KNOWN_FRAMEWORKS",
    "OS_NAMES",
    "ArrayTask",
    "DistributedModel",
    "JobSpec",
    "PolicyModel",
    "Requirements",
    "SpecError",
    "capped",
    "check_cuda_runtime",
    "check_driver_version",
    "check_os",
    "exec_problem",
    "extras_refusal",
    "format_validation_error",
    "job_spec_from_mapping",
    "load_job_spec",
    "name_problem",
    "parse_compute_capability",
]

KNOWN_FRAMEWORKS: tuple[str, ...] = (
    "torch",
    "jax",
    "jaxlib",
    "tensorflow",
    "mlx",
    "cupy",
    "onnxruntime",
    "tensorrt",
    "triton",
    "vllm",
    "transformers",
    "numpy",
)
"""Framework names a job may put in ``requirements.frameworks``."""


class SpecError(ValueError):
    """A job spec is invalid. The message names each bad field and what is allowed."""


def extras_refusal(name: str, extras: Iterable[str], spec: str) -> str:
    """Why a framework requirement with extras (``torch[opt-einsum]>=2.4``) is refused, with the fix.

    Extras are refused in the TOML spec and in ``--framework`` alike: gpulayer checks the
    installed version of a framework, never which optional dependencies came with it, so
    accepting ``[opt-einsum]`` would promise a check that is not made. The hint names the
    base requirement to write instead.
    """
    listed = ",".join(sorted(extras))
    base = name.split("[", 1)[0].strip()
    return (
        f"{name if '[' in name else f'{base}[{listed}]'}: extras ([{listed}]) are not checked by gpulayer "
        f"(it checks the installed version only); write the base name: {base} = {spec.strip()!r} "
        f"(--framework '{base}{spec.strip()}')"
    )


def parse_compute_capability(value: object) -> tuple[int, int] | None:
    """Parse a CUDA compute capability into (major, minor).

    Accepts ``8``, ``8.6``, ``"8.6"``, ``" 9.0"``, ``"12"``; a missing minor is 0.
    Placeholders (``[N/A]`` and the like), empty strings and None give None.

    Raises:
        ValueError: if the value is neither a placeholder nor ``major[.minor]`` digits.
    """
    if value is None or isinstance(value, bool):
        if value is None:
            return None
        raise ValueError(f"not a compute capability: {value!r}")
    if isinstance(value, tuple | list) and len(value) == 2:
        return (int(value[0]), int(value[1]))
    text = str(value).strip()
    if not text or text.startswith("[") or text.upper() == "N/A":
        return None
    major, _, minor = text.partition(".")
    if not major.isdigit() or (minor and not minor.isdigit()):
        raise ValueError(f"not a compute capability: {value!r} (expected e.g. 8.6)")
    return (int(major), int(minor or "0"))


OS_NAMES: tuple[str, ...] = ("linux", "darwin")
"""Values of the ``os`` requirement (``platform.system()`` lower-cased)."""


def check_driver_version(v: object) -> str | None:
    """Validate ``min_driver_version``: an NVIDIA driver version like ``"525.60.13"``.

    Raises:
        ValueError: naming what is allowed.
    """
    if v is None:
        return None
    text = str(v).strip() if isinstance(v, str | int | float) and not isinstance(v, bool) else ""
    parts = text.split(".")
    if not text or len(parts) > 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{v!r} is not an NVIDIA driver version (e.g. '525.60.13')")
    return text


def check_cuda_runtime(v: object) -> str | None:
    """Validate ``cuda_runtime``: a PEP 440 specifier on the CUDA build (``">=12.1"``);
    a bare version (``"12.4"``) means ``==12.4``.

    Raises:
        ValueError: naming what is allowed.
    """
    if v is None:
        return None
    if not isinstance(v, str) or not v.strip() or len(v) > 200:  # (a limit: parsing is linear in the clauses)
        shown = f"{v[:40]!r}..." if isinstance(v, str) and len(v) > 200 else repr(v)
        raise ValueError(f"{shown} is not a version specifier of at most 200 characters (e.g. '>=12.1' or '==12.4')")
    text = v.strip()
    if text[0].isdigit():
        text = f"=={text}"
    try:
        SpecifierSet(text)
    except InvalidSpecifier as e:
        raise ValueError(f"{v!r} is not a version specifier (e.g. '>=12.1' or '==12.4')") from e
    return text


def check_os(v: object) -> str | None:
    """Validate ``os``: one of :data:`OS_NAMES` (case-insensitive).

    Raises:
        ValueError: naming the allowed values.
    """
    if v is None:
        return None
    if not isinstance(v, str) or v.strip().lower() not in OS_NAMES:
        raise ValueError(f"{v!r} is not one of: {', '.join(OS_NAMES)}")
    return v.strip().lower()


def _enum_values(enum_type: type[Accelerator] | type[MemoryKind]) -> str:
    return ", ".join(m.value for m in enum_type)


def format_validation_error(err: ValidationError, prefix: str = "", whole: str = "spec") -> str:
    """Render a pydantic error as lines ``field.path: message`` (one per problem); a problem of the
    whole model (several fields together) is named ``whole`` (or ``prefix`` without its dot)."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        loc = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or whole)
        msg = e["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{loc}: {msg}")
    return "\n".join(lines)


class Requirements(BaseModel):
    """``[requirements]`` of a job spec: what a worker must offer.

    ``gpu_count`` defaults to 0 for ``cpu`` and 1 otherwise and counts devices per host.
    ``gpu_memory_gb`` is per device, decimal GB (10^9 bytes).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    accelerator: Accelerator = Accelerator.CPU
    gpu_count: int | None = Field(default=None, ge=0, le=64)
    gpu_memory_gb: float | None = Field(default=None, gt=0, le=100_000)
    gpu_memory_kind: MemoryKind | None = None
    min_cuda_compute_capability: str | None = None
    frameworks: dict[str, str] = Field(default_factory=dict)
    python: str | None = Field(default=None, max_length=200)
    requires_float64: bool = False
    min_driver_version: str | None = None
    cuda_runtime: str | None = None
    os: str | None = None

    @field_validator("min_driver_version", mode="before")
    @classmethod
    def _min_driver(cls, v: object) -> object:
        return check_driver_version(v)

    @field_validator("cuda_runtime", mode="before")
    @classmethod
    def _cuda_runtime(cls, v: object) -> object:
        return check_cuda_runtime(v)

    @field_validator("os", mode="before")
    @classmethod
    def _os(cls, v: object) -> object:
        return check_os(v)

    @field_validator("accelerator", mode="before")
    @classmethod
    def _accelerator(cls, v: object) -> object:
        if isinstance(v, str) and v.lower() not in {a.value for a in Accelerator}:
            raise ValueError(f"{v!r} is not one of: {_enum_values(Accelerator)}")
        return v.lower() if isinstance(v, str) else v

    @field_validator("gpu_memory_kind", mode="before")
    @classmethod
    def _memory_kind(cls, v: object) -> object:
        if isinstance(v, str) and v.lower() not in {k.value for k in MemoryKind}:
            raise ValueError(f"{v!r} is not one of: {_enum_values(MemoryKind)}")
        return v.lower() if isinstance(v, str) else v

    @field_validator("min_cuda_compute_capability", mode="before")
    @classmethod
    def _cc(cls, v: object) -> object:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float | str):
            raise ValueError("must be a number or string like 8.0 or '8.6'")
        cc = parse_compute_capability(v)
        if cc is None:
            raise ValueError(f"{v!r} is not a compute capability (expected e.g. 8.6)")
        return f"{cc[0]}.{cc[1]}"

    @field_validator("frameworks")
    @classmethod
    def _frameworks(cls, v: dict[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, spec in v.items():
            key = name.strip().lower()
            if "[" in key and key.split("[", 1)[0].strip() in KNOWN_FRAMEWORKS:
                extras = key.split("[", 1)[1].rstrip("]").split(",")
                raise ValueError(extras_refusal(name.strip(), [e.strip() for e in extras if e.strip()], spec))
            if key not in KNOWN_FRAMEWORKS:
                raise ValueError(
                    f"unknown framework {name!r}; known: {', '.join(KNOWN_FRAMEWORKS)}"
                )
            try:
                if len(spec) > 200:  # (a limit: parsing and matching are linear in the clauses)
                    raise InvalidSpecifier(spec)
                SpecifierSet(spec)
            except InvalidSpecifier as e:
                shown = f"{spec[:40]!r}..." if len(spec) > 40 else repr(spec)
                raise ValueError(f"{name}: {shown} is not a PEP 440 specifier of at most 200 characters "
                                 "(e.g. '>=2.4,<3')") from e
            out[key] = spec.strip()
        return out

    @field_validator("python")
    @classmethod
    def _python(cls, v: str | None) -> str | None:
        if v is None:
            return None
        try:
            SpecifierSet(v)
        except InvalidSpecifier as e:
            raise ValueError(f"{v!r} is not a PEP 440 specifier (e.g. '>=3.10')") from e
        return v.strip()

    @model_validator(mode="after")
    def _counts(self) -> Requirements:
        if self.accelerator is Accelerator.CPU:
            if self.gpu_count:
                raise ValueError("gpu_count must be 0 when accelerator is 'cpu'")
            for name in ("gpu_memory_gb", "gpu_memory_kind", "min_cuda_compute_capability"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} needs a GPU accelerator (cuda, mps, rocm), not cpu")
        elif self.gpu_count == 0:
            raise ValueError(f"gpu_count must be at least 1 for accelerator {self.accelerator.value!r}")
        if self.min_cuda_compute_capability is not None and self.accelerator is not Accelerator.CUDA:
            raise ValueError("min_cuda_compute_capability applies only to accelerator 'cuda'")
        return self

    @property
    def effective_gpu_count(self) -> int:
        """Devices wanted per host: ``gpu_count``, or its default (0 for cpu, else 1)."""
        if self.gpu_count is not None:
            return self.gpu_count
        return 0 if self.accelerator is Accelerator.CPU else 1


class DistributedModel(BaseModel):
    """``[distributed]`` of a job spec: a torch.distributed job."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nnodes: int = Field(default=1, ge=1, le=256)
    nproc_per_node: int = Field(default=1, ge=1, le=256)
    backend: Literal["gloo", "nccl"] | None = None


MAX_EXEC_STRING_BYTES = 131_071
"""The longest argument or ``NAME=value`` environment entry ``exec`` takes on Linux (MAX_ARG_STRLEN,
32 pages of 4 KiB, less its NUL)."""

MAX_EXEC_TOTAL_BYTES = 1_000_000
"""The most bytes of command line and environment together a job may have (10^6; Linux allows a
quarter of the stack limit, 2 MiB by default, minus what the launcher adds)."""


def exec_problem(text: str, extra_bytes: int = 0) -> str | None:
    """Why ``text`` cannot be passed to ``exec`` as an argument or an environment name or value (None
    when it can): a NUL byte ends a C string, text that does not encode to bytes (a lone surrogate
    other than the ones ``surrogateescape`` uses for undecodable bytes) cannot be sent, and one string
    longer than :data:`MAX_EXEC_STRING_BYTES` (with ``extra_bytes``, e.g. an environment entry's
    ``NAME=``) is refused by the kernel (E2BIG)."""
    if "\0" in text:
        return "must not contain a NUL byte"
    try:
        size = len(text.encode("utf-8", "surrogateescape")) + extra_bytes
    except UnicodeEncodeError:
        return "must be text that encodes to bytes (it holds a lone surrogate)"
    if size > MAX_EXEC_STRING_BYTES:
        return (f"is {size} bytes long: at most {MAX_EXEC_STRING_BYTES} bytes reach a program "
                "(Linux's limit for one argument or environment entry); pass large data in a file")
    return None


def _is_control(ch: str) -> bool:
    """C0 (incl. newline, tab, ESC), DEL and C1 control characters."""
    o = ord(ch)
    return o < 0x20 or 0x7F <= o <= 0x9F


def name_problem(name: str | None) -> str | None:
    """Why ``name`` cannot be a new job's name, or None when it can.

    Names are shown on terminals (every user's, on every machine of the cluster), so a new
    job's name has no control characters at all: C0 (escape, newline, tab, ...), DEL, C1.
    Checked at submit (:func:`job_spec_from_mapping`), not when a stored job or a peer's
    view is read: those are escaped where shown (:func:`gpulayerd.text.escape`).
    """
    bad = None if name is None else next((ch for ch in name if _is_control(ch)), None)
    if bad is None:
        return None
    return (f"must not contain control characters (found {bad!a}): escape sequences, newlines "
            "and tabs are refused")


class ArrayTask(BaseModel):
    """Which task of which array a job is: its ``GPULAYER_ARRAY_*`` variables."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    array_id: str = Field(max_length=64)
    index: int = Field(ge=0)
    count: int = Field(ge=1)


class JobSpec(BaseModel):
    """A job as a user writes it (TOML file or CLI flags).

    ``command`` is a list of arguments (a string is split with shlex). A leading
    ``python`` runs with the matched environment's interpreter. ``workdir`` must exist
    on the worker that runs the job, unless the job is shipped (``ship``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(default=None, max_length=200)
    command: list[str]
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    requirements: Requirements = Field(default_factory=Requirements)
    distributed: DistributedModel | None = None
    policy: PolicyModel = Field(default_factory=PolicyModel)
    user: str | None = Field(default=None, max_length=64)
    """The account the job runs as. Set by the owner daemon from the submitter's kernel
    credentials (``SO_PEERCRED``); a value in a submitted spec is replaced."""
    path: str | None = Field(default=None, max_length=8192)
    """The submitter's ``PATH``, captured by the CLI at submit; the job's ``PATH``."""
    profile: str | None = Field(default=None, max_length=200)
    """A named runtime profile (:mod:`gpulayerd.core.matching.profiles`), expanded at submit into
    ``requirements``."""
    requirement_origins: dict[str, str] = Field(default_factory=dict, max_length=64)
    """Set at submit when ``profile`` is expanded: requirement (``frameworks.torch``) -> where its
    value comes from (``from profile torch-2.4-cu124``, or ``job (profile torch-2.4-cu124 says ...)``)."""

    array: str | None = Field(default=None, max_length=1000)
    """``0-99[:STEP][%MAX]`` or ``1,5,9[%MAX]``: a job array (:mod:`gpulayerd.core.arrays`), one task per index."""
    after: list[str] = Field(default_factory=list, max_length=64)
    """Dependencies, ``ID[:ok|any|notok]`` (:mod:`gpulayerd.core.dependencies`); full ids after submit."""
    array_task: ArrayTask | None = None
    """Set by the owner on an array's task (never taken from a submission)."""
    ship: ShipField = None
    """The workdir travels as a snapshot (``--ship``; :mod:`gpulayerd.models.snapshots`): no worker needs it."""
    worker: str | None = Field(default=None, min_length=1, max_length=253, pattern=r"^[A-Za-z0-9._-]+$")
    """The one worker that may run it, by name (``--worker``; :mod:`gpulayerd.core.matching.targeting`)."""
    slurm: bool = True
    """False: no Slurm worker runs it (``--no-slurm``)."""

    @field_validator("array")
    @classmethod
    def _array(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_array(v, max_size=MAX_INDEX + 1)  # the size is the daemon's max_array_size to judge
            except ArrayError as e:
                raise ValueError(str(e)) from None
        return v

    @field_validator("after")
    @classmethod
    def _after(cls, v: list[str]) -> list[str]:
        try:
            return [str(parse_after(a)) for a in v]
        except DependencyError as e:
            raise ValueError(str(e)) from None

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: object) -> object:
        if isinstance(v, str):
            v = shlex.split(v)
        if isinstance(v, list) and not v:
            raise ValueError("must not be empty (e.g. command = [\"python\", \"train.py\"])")
        return v

    @field_validator("command")
    @classmethod
    def _command_items(cls, v: list[str]) -> list[str]:
        if not v[0].strip():
            raise ValueError("the program (first item) must not be empty")
        for i, arg in enumerate(v):
            problem = exec_problem(arg)
            if problem is not None:
                raise ValueError(f"item {i} ({'the program' if i == 0 else 'an argument'}) {problem}")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if not v.strip():
            raise ValueError("must not be empty")
        if "\0" in v:
            raise ValueError("must not contain a NUL byte")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError("must be valid UTF-8 text") from e
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        problem = None if v is None else exec_problem(v)
        if problem is not None:
            raise ValueError(f"(the job's PATH) {problem}")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not key or "=" in key or exec_problem(key) is not None:
                raise ValueError(f"{key!a} is not a valid environment variable name (no '=', NUL, or text "
                                 "that cannot be encoded)")
            problem = exec_problem(value, extra_bytes=len(key.encode("utf-8", "surrogateescape")) + 1)
            if problem is not None:
                raise ValueError(f"the value of {key!a} {problem}")
        total = sum(len(k) + len(x) + 2 for k, x in v.items())
        if total > MAX_EXEC_TOTAL_BYTES:
            raise ValueError(f"the environment is {total} bytes: at most {MAX_EXEC_TOTAL_BYTES} bytes of command line "
                             "and environment together")
        return v

    @model_validator(mode="after")
    def _fits_exec(self) -> JobSpec:
        total = sum(len(a.encode("utf-8", "surrogateescape")) + 1 for a in self.command)
        total += sum(len(k) + len(x) + 2 for k, x in self.env.items())
        if total > MAX_EXEC_TOTAL_BYTES:
            raise ValueError(f"command and env together are {total} bytes: at most {MAX_EXEC_TOTAL_BYTES} bytes reach "
                             "a program (pass large data in a file)")
        return self

    def to_core(self, job_id: str = "") -> JobRequest:
        """Convert to the core's :class:`JobRequest`."""
        r = self.requirements
        dist = None
        if self.distributed is not None:
            backend = self.distributed.backend or (
                "nccl" if r.accelerator is Accelerator.CUDA else "gloo"
            )
            dist = DistributedRequest(nnodes=self.distributed.nnodes, nproc_per_node=self.distributed.nproc_per_node,
                                      backend=backend)
        return JobRequest(
            job_id=job_id,
            accelerator=r.accelerator,
            gpu_count=r.effective_gpu_count,
            gpu_memory_bytes=None if r.gpu_memory_gb is None else round(r.gpu_memory_gb * GB),
            gpu_memory_kind=r.gpu_memory_kind,
            min_cuda_compute_capability=parse_compute_capability(r.min_cuda_compute_capability),
            frameworks=dict(r.frameworks),
            python=r.python,
            requires_float64=r.requires_float64,
            distributed=dist,
            workdir=None if self.ship is not None else self.workdir,  # shipped: no worker needs it
            user=self.user or "",
            min_driver_version=r.min_driver_version,
            cuda_runtime=r.cuda_runtime,
            os=r.os,
            worker=self.worker or "", slurm=self.slurm,
        )


def load_job_spec(path: str | Path, base_dir: str | Path | None = None) -> JobSpec:
    """Load a job spec from a TOML file.

    A relative ``workdir`` is taken relative to ``base_dir`` (default: the current
    directory); a missing ``workdir`` becomes ``base_dir``. The workdir is not checked
    for existence here: that is the worker's business (or the submit command's).

    Raises:
        SpecError: the file cannot be read, is not TOML, or has invalid fields; the
            message names the file and each bad field.
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise SpecError(f"{p}: cannot read: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise SpecError(f"{p}: not UTF-8 text: {e}") from e
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{p}: malformed TOML: {e}") from e
    return job_spec_from_mapping(data, source=str(p), base_dir=base_dir)


def job_spec_from_mapping(
    data: Mapping[str, Any], source: str = "spec", base_dir: str | Path | None = None
) -> JobSpec:
    """Validate a mapping (parsed TOML or JSON) as a :class:`JobSpec`.

    A ``name`` with control characters is refused (:func:`name_problem`).

    Raises:
        SpecError: naming ``source`` and each bad field.
    """
    try:
        spec = JobSpec.model_validate(dict(data))
    except ValidationError as e:
        raise SpecError(f"{source}: invalid job spec\n{format_validation_error(e)}") from e
    problem = name_problem(spec.name)
    if problem is not None:
        raise SpecError(f"{source}: invalid job spec\nname: {problem}")
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    workdir = Path(spec.workdir) if spec.workdir else base
    if spec.workdir and spec.workdir.startswith("~"):
        expanded = Path(os.path.expanduser(spec.workdir))
        if str(expanded).startswith("~"):
            raise SpecError(f"{source}: invalid job spec\nworkdir: cannot expand {spec.workdir!r} (no such user)")
        workdir = expanded
    if not workdir.is_absolute():
        workdir = base / workdir
    return spec.model_copy(update={"workdir": os.path.normpath(workdir)})


def capped(spec: JobSpec, max_time_limit_s: float | None) -> JobSpec:
    """``spec`` under a daemon's ``max_time_limit`` (seconds; None: no cap): a job without a time limit
    gets that one; a longer one is refused.

    Raises:
        SpecError: ``policy.time_limit`` is over the cap (naming both).
    """
    if max_time_limit_s is None:
        return spec
    limit = spec.policy.time_limit
    if limit is None:
        return spec.model_copy(update={"policy": spec.policy.model_copy(update={"time_limit": max_time_limit_s})})
    if limit > max_time_limit_s:
        raise SpecError(f"job spec: invalid job spec\npolicy.time_limit: {format_duration(limit)} is over this "
                        f"daemon's max_time_limit: at most {format_duration(max_time_limit_s)}")
    return spec
