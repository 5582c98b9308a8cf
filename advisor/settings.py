"""The settings of a tuning run (`TuneSettings`) and the `--config` file that can hold them.

Defaults live here and nowhere else: the CLI passes only the flags a user set.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from advisor.errors import SettingsError
from advisor.frozen import Frozen
from advisor.knobs import BASE_GROUP, KNOB, KNOB_GROUPS, MEMORY_GROUP, NETWORK_GROUP
from advisor.memory import MemoryBudget

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

__all__ = [
    "Objective",
    "SamplerName",
    "TuneSettings",
    "mask_url",
    "read_settings_file",
    "setting_help",
    "settings_error",
]

SamplerName = Literal["tpe", "random", "grid"]
Objective = Literal["time-to-loss", "throughput"]
STORAGE_SCHEMES = ("sqlite", "postgresql", "mysql", "journal")


class TuneSettings(Frozen):
    """Everything `advisor tune` / `advisor.tune()` accepts; the CLI maps flags one-to-one."""

    # Each description is also the flag's help (`advisor tune --help`), with the default after
    # it; `shown_default` says in words a default that is computed.
    spec: str = Field(min_length=1, description="factory spec: path/file.py:attr or pkg.mod:attr")
    trials: int = Field(
        default=20,
        ge=1,
        description="distinct configurations to measure; a trial timed in parts also measures "
        "its other accumulation steps, counted together as one",
    )
    timeout: float | None = Field(
        default=None, gt=0, description="search budget in seconds (re-measurements follow)"
    )
    trial_seconds: float = Field(
        default=2.0,
        gt=0,
        description="timed window of each trial, its warm-up as long; a search trial's window "
        "ends sooner once its rate is precise",
    )
    warmup_steps: int = Field(default=3, ge=1, description="optimizer steps before timing")
    trial_timeout: float | None = Field(
        default=None,
        gt=0,
        description="hard limit per trial in seconds",
        json_schema_extra={"shown_default": "120 + 10 x the window"},
    )
    global_batch_size: int | None = Field(
        default=None, ge=1, description="keep micro-batch x accumulation x processes at this value"
    )
    batch_sizes: tuple[int, ...] | None = Field(
        default=None,
        description="micro-batch sizes to try, e.g. 16,32,64",
        json_schema_extra={"shown_default": "powers of two around yours"},
    )
    accumulation_steps: tuple[int, ...] = Field(
        default=(1, 2, 4, 8), description="accumulation steps to try"
    )
    max_world_size: int | None = Field(
        default=None,
        ge=1,
        description="most DDP processes to try; 1: none",
        json_schema_extra={"shown_default": "one per GPU, or per core on CPU"},
    )
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="where to train")
    storage: str | None = Field(
        default=None,
        description="Optuna storage URL",
        json_schema_extra={"shown_default": "sqlite:///OUT/study.db"},
    )
    study_name: str | None = Field(
        default=None, description="study name", json_schema_extra={"shown_default": "from the spec"}
    )
    out: Path | None = Field(
        default=None,
        description="output folder",
        json_schema_extra={"shown_default": "reports/STUDY"},
    )
    worker: str | None = Field(
        default=None,
        description="this worker's name in a shared study; --trials counts the configurations "
        "this worker measured",
        json_schema_extra={"shown_default": "the host name"},
    )
    seed: int = Field(default=0, description="sampler seed")
    sampler: SamplerName = Field(default="tpe", description="how configurations are proposed")
    early_stop: float = Field(
        default=0.5,
        ge=0,
        lt=1,
        description="stop a search trial, from an eighth of its window on, once its projected "
        "throughput is below this fraction of the best so far; 0 never stops one early, nor "
        "rejects a knob value",
    )
    knobs: tuple[str, ...] = Field(
        default=(BASE_GROUP,),
        description=f"knobs to search: {BASE_GROUP}, all, or a comma-separated list of groups "
        f"({', '.join(g for g in KNOB_GROUPS if g != BASE_GROUP)}) and knob names",
    )
    objective: Objective = Field(
        default="time-to-loss",
        description="what wins: time-to-loss, the soonest to your loss in a race from the same "
        "weights; throughput, the highest samples/s",
    )
    race_seconds: float = Field(
        default=10.0,
        ge=0,
        description="training time of each racer; 0: no race, and only configurations at your "
        "global batch are searched (no race could show that another reaches your loss sooner)",
    )
    race_continue: float = Field(
        default=3.0,
        ge=1,
        description="where the race kept your global batch and another raced, the baseline, the "
        "best at your batch and the nearest other batch go on from where they stopped to this "
        "many race lengths, to judge later in training; 1: they do not",
    )
    schedule: Literal["off", "auto"] = Field(
        default="off",
        description="auto: after the race, track the noise scale along a longer run of your "
        "configuration and race a batch-size schedule that follows it; it ships only if it "
        "reaches your loss sooner than the fixed recommendation (costs about four runs of "
        "--schedule-seconds)",
    )
    schedule_seconds: float = Field(
        default=60.0,
        gt=0,
        description="with --schedule auto: the training time each racer of the schedule race has",
    )
    confirm_top: int = Field(default=3, ge=1, description="finalists re-measured with the baseline")
    confirm_repeats: int = Field(default=2, ge=1, description="re-runs per finalist")
    confirm_max_repeats: int = Field(
        default=10,
        ge=1,
        description="re-runs of the recommendation and the baseline at most, while their "
        "speed-up ratios disagree (a busy machine); then the claim is marked unconfirmed",
    )
    memory_headroom: float = Field(
        default=0.1, ge=0, lt=1, description="fraction of the memory to keep free"
    )
    nnodes: int = Field(
        default=1, ge=1, description="machines to tune over; the same command on each"
    )
    node_rank: int | None = Field(
        default=None, ge=0, description="0 searches, the rest serve (NODE_RANK, SLURM_NODEID)"
    )
    rdzv_endpoint: str | None = Field(
        default=None, pattern=r"^[^\s:]+:[0-9]+$", description="node 0's HOST:PORT (MASTER_ADDR)"
    )
    join_timeout: float = Field(default=300.0, gt=0, description="seconds to wait for machines")
    memory_budget: MemoryBudget | None = Field(
        default=None,
        description="the most memory a configuration may use: bytes with a unit (2GiB) or a "
        "share of the device's (0.8); each GPU's peak on CUDA, the whole trial's on the host "
        "(default: the device less --memory-headroom)",
    )

    @field_validator("batch_sizes", "accumulation_steps", mode="before")
    @classmethod
    def _parse_int_list(cls, value: object) -> object:
        if isinstance(value, str):
            items = [item.strip() for item in value.split(",") if item.strip()]
            if not items or not all(item.isdigit() and int(item) >= 1 for item in items):
                raise ValueError(
                    f"{value!r} is not a comma-separated list of positive integers (e.g. 16,32,64)"
                )
            return tuple(int(item) for item in items)
        return value

    @field_validator("batch_sizes", "accumulation_steps")
    @classmethod
    def _positive_unique(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        if not value or any(item < 1 for item in value):
            raise ValueError(f"{list(value)} must be a non-empty list of integers >= 1")
        return tuple(sorted(set(value)))

    @field_validator("knobs", mode="before")
    @classmethod
    def _parse_knobs(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(",") if item.strip())
        return value

    @field_validator("knobs")
    @classmethod
    def _known_knobs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        known = ("all", *KNOB_GROUPS, *KNOB)
        for name in value:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(
                    f"unknown knob group {name!r}{hint} (use classic, all, or some of "
                    f"{', '.join(known[1:])})"
                )
        if not value:
            raise ValueError("name at least one knob group, e.g. classic")
        return value

    @property
    def searched_knobs(self) -> frozenset[str]:
        """The knobs `knobs` names, groups expanded; the base group's are always searched, the
        memory group's under `memory_budget`, the network group's over several machines."""
        names = set(KNOB_GROUPS[BASE_GROUP])
        if self.memory_budget is not None:
            names.update(KNOB_GROUPS[MEMORY_GROUP])
        if self.nnodes > 1:
            names.update(KNOB_GROUPS[NETWORK_GROUP])
        for name in self.knobs:
            names.update(KNOB if name == "all" else KNOB_GROUPS.get(name, (name,)))
        return frozenset(names)

    @field_validator("storage")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme = value.split("://", 1)[0].split("+", 1)[0] if "://" in value else ""
        if scheme not in STORAGE_SCHEMES:
            raise ValueError(
                f"unknown storage URL scheme {scheme or value!r}: use sqlite:///path/study.db, "
                "journal:///path/study.log, postgresql://user:pass@host/db or "
                "mysql://user:pass@host/db"
            )
        return value

    @field_validator("study_name", "worker")
    @classmethod
    def _name_is_usable(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", value):
            raise ValueError(
                f"{value!r} is not a usable name: use letters, digits, '.', '_' or '-'"
            )
        return value

    @model_validator(mode="after")
    def _batch_modes_exclusive(self) -> TuneSettings:
        if self.global_batch_size is not None and self.batch_sizes is not None:
            raise ValueError(
                "global_batch_size and batch_sizes exclude each other: with a fixed global "
                "batch advisor derives the micro-batches; choose one"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _launcher_environment(cls, data: Any) -> Any:
        """Over several machines, what torchrun or SLURM set: this node's rank, node 0's address."""
        if not isinstance(data, dict) or int(data.get("nnodes") or 1) < 2:
            return data
        env, found = os.environ, {}
        names = ("NODE_RANK", "GROUP_RANK", "SLURM_NODEID")
        found["node_rank"] = next((env[name] for name in names if name in env), 0)
        if address := env.get("MASTER_ADDR"):
            found["rdzv_endpoint"] = f"{address}:{env.get('MASTER_PORT', 29500)}"
        return found | {k: v for k, v in data.items() if v is not None}

    @model_validator(mode="after")
    def _nodes_meet(self) -> TuneSettings:
        if self.nnodes > 1 and self.rdzv_endpoint is None:
            raise ValueError(f"nnodes={self.nnodes} needs --rdzv-endpoint HOST:PORT (node 0's)")
        if (self.node_rank or 0) >= self.nnodes:
            raise ValueError(f"node_rank {self.node_rank}: number the machines 0 to nnodes - 1")
        return self

    @model_validator(mode="after")
    def _repeats_ordered(self) -> TuneSettings:
        if self.confirm_max_repeats < self.confirm_repeats:
            raise ValueError(
                f"confirm_max_repeats ({self.confirm_max_repeats}) is below confirm_repeats "
                f"({self.confirm_repeats}): raise it to {self.confirm_repeats} or more"
            )
        return self

    @property
    def resolved_study_name(self) -> str:
        """The study name, derived from the spec when none was given (stable across runs)."""
        if self.study_name:
            return self.study_name
        module, _, attr = self.spec.rpartition(":")
        stem = Path(module).stem if module.endswith(".py") else module.rsplit(".", 1)[-1]
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{stem}-{attr}").strip("-.")
        return name or "study"

    @property
    def keeps_global_batch(self) -> bool:
        """Whether only configurations at the user's global batch can be recommended: no race
        (`race_seconds` 0) can show that another reaches their loss sooner."""
        return self.objective == "time-to-loss" and self.race_seconds == 0

    @property
    def trial_timeout_s(self) -> float:
        return self.trial_timeout or 120.0 + 10.0 * self.trial_seconds

    @property
    def out_dir(self) -> Path:
        return self.out if self.out is not None else Path("reports") / self.resolved_study_name

    @property
    def worker_name(self) -> str:
        return self.worker or socket.gethostname()

    @property
    def storage_url(self) -> str:
        if self.storage:
            return self.storage
        return f"sqlite:///{(self.out_dir / 'study.db').resolve()}"


def settings_error(exc: ValidationError, prefix: str = "invalid settings") -> SettingsError:
    """Turn a pydantic error into one line naming every problem; an unknown name comes with
    the closest valid one."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "settings"
        if error["type"] == "extra_forbidden":
            problems.append(f"{where}: unknown setting{_closest_setting(where)}")
            continue
        message = str(error["msg"]).removeprefix("Value error, ")
        got = error.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        problems.append(f"{where}: {message}{shown}")
    return SettingsError(f"{prefix}: " + "; ".join(problems))


def _closest_setting(name: str) -> str:
    close = difflib.get_close_matches(name, TuneSettings.model_fields, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def read_settings_file(path: Path) -> dict[str, Any]:
    """The file's settings, names as in `TuneSettings` (`trial-seconds` and `trial_seconds`
    both work). Values are validated later, with the flags, so every problem is named at once."""
    if path.suffix not in (".toml", ".json"):
        raise SettingsError(f"{path}: use a .toml or .json settings file")
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"cannot read settings file {path}: {exc.strerror}") from None
    try:
        values = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise SettingsError(f"{path} is not valid {path.suffix[1:].upper()}: {exc}") from None
    if not isinstance(values, dict):
        raise SettingsError(f"{path}: expected a table of settings, e.g. trials = 20")
    return {str(name).replace("-", "_"): value for name, value in values.items()}


def mask_url(url: str) -> str:
    """The storage URL with its password replaced by `***`."""
    from sqlalchemy.engine import make_url  # Optuna's dependency; trial processes need none
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return url.split("@", 1)[-1] if "@" in url else url


def setting_help(name: str) -> str:
    """A setting's description, with its default in brackets: the help of its CLI flag."""
    info = TuneSettings.model_fields[name]
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    default = extra.get("shown_default", info.default)
    if isinstance(default, tuple):
        default = ",".join(map(str, default))
    text = (info.description or name.replace("_", " ")).rstrip(".")
    text = text[0].upper() + text[1:]
    if default is None:
        return f"{text}."
    shown = f"{default:g}" if isinstance(default, float) else str(default)
    return f"{text} [{shown}]."
