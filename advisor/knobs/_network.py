"""The knobs of DDP's gradient all-reduce, which matter most where it crosses a network: the
`network` group, searched by default where a tune spans machines (`--nnodes`) and on one machine
with `--knobs network`; they apply only under DDP.

DDP's `static_graph` is not one: with accumulation (`no_sync`) the generated script's DDP run
failed an internal assert of torch 2.13's reducer (`expect_autograd_hooks_`)."""

from collections.abc import Mapping
from typing import Annotated, Any

from advisor.knobs._row import Counterpart, Knob, by_hand, setting

__all__ = ["NETWORK_GROUP", "BucketCapMb", "GradientAsBucketView"]

NETWORK_GROUP = "network"  # searched by default where a tune spans machines
DEFAULT_BUCKET_MB = 25  # DistributedDataParallel's


def _under_ddp(fields: Mapping[str, Any]) -> bool:
    return fields.get("parallel_mode") == "ddp"


def _by_hand(name: str, default: Any, how: str) -> Counterpart:
    """The line that sets DistributedDataParallel's `name` where the framework has no setting:
    `how` with `name=value` in it, under DDP and off DDP's default."""

    def line(value: Any, config: Any) -> str | None:
        if value == default or config.parallel_mode != "ddp":
            return None
        return how.format(f"{name}={value!r}")

    return by_hand(line)


def _row(name: str, title: str, values: tuple[Any, ...], tag: str, hf: Any = None) -> Knob:
    default = values[0]
    return Knob(
        group=NETWORK_GROUP,
        title=title,
        values=values,
        applies=_under_ddp,
        tag=tag,
        exports={
            "hf": hf or _by_hand(name, default, "construct DistributedDataParallel with {}"),
            "lightning": _by_hand(name, default, "strategy=DDPStrategy({})"),
            "accelerate": _by_hand(
                name, default, "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs({})])"
            ),
        },
    )


def _hf_bucket(value: Any, config: Any) -> dict[str, Any]:
    under_ddp = config.parallel_mode == "ddp" and value != DEFAULT_BUCKET_MB
    return {"ddp_bucket_cap_mb": value} if under_ddp else {}


BucketCapMb = Annotated[
    int,
    _row(
        "bucket_cap_mb",
        "DDP's gradient bucket size: larger buckets, fewer and larger all-reduces",
        (DEFAULT_BUCKET_MB, 100),
        "bucket={}MB",
        hf=setting(_hf_bucket),
    ),
]
GradientAsBucketView = Annotated[
    bool,
    _row(
        "gradient_as_bucket_view",
        "DDP's gradients as views into its buckets: no copy between them",
        (False, True),
        "grad-view",
    ),
]
