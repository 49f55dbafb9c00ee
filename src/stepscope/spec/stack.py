"""`StackSpec`: the training software a plan runs on (Megatron-Core with Transformer Engine, PyTorch FSDP, DeepSpeed,
...), as the behaviours the performance model prices differently per stack. Pure Python, no numpy.

A stack is not a fitted factor: each field names how that software schedules or computes one thing, with the
source of that behaviour in its preset (`stepscope/data/stacks/*.toml`), and the model prices each behaviour from
bytes, FLOPs and the system's measured rates (`perfmodel/model/`). Presets are TOML files users can copy and edit;
`load_stack` takes a preset name or a path.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from stepscope.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

DEFAULT_STACK = "megatron-core"

CHOICES = {
    "data_parallel": ("megatron", "ddp", "fsdp", "after-backward"),
    "attention": ("best", "flash-attention-2"),
    "context_parallel": ("p2p-ring", "all-gather", "torch-all-gather"),
    "tensor_overlap": ("userbuffers", "async-tp"),
    "pipeline_p2p": ("overlapped", "synchronous"),
}
"""The values each behaviour may take (`perfmodel/model/` prices each; docs/perfmodel.md describes them)."""


@dataclass(frozen=True)
class StackSpec:
    """How one training stack runs a step, where stacks differ in what it costs."""

    name: str
    """Preset or file name."""
    description: str
    """What the stack is, with versions."""
    data_parallel: str = "megatron"
    """Gradient buckets and when they are reduced, weights gathered: `megatron` (Megatron-Core's DDP and
    distributed optimizer: buckets of max(40M, 1M x dp) parameters, one per virtual-pipeline chunk, reductions
    launched per chunk, weights gathered behind the next forward), `ddp` (PyTorch DDP: 25 MiB buckets behind the
    last backward), `fsdp` (PyTorch FSDP: one all-gather and one reduce-scatter per transformer block, prefetched one
    block ahead), `after-backward` (Megatron-LM before Megatron-Core's overlap, DeepSpeed ZeRO-1/2 by default: the
    gradients all-reduced in large buckets once the backward is done, updated weights gathered in the optimizer
    step, nothing overlapped)."""
    attention: str = "best"
    """The fused attention kernel: the system's best (`flash_efficiency`: cuDNN or FlashAttention-3 on Hopper) or
    FlashAttention-2 (`flash2_efficiency`)."""
    context_parallel: str = "p2p-ring"
    """How context-parallel ranks exchange K/V: Transformer Engine's ring (each step's K/V sent while the previous
    block computes), an all-gather before attention (Llama 3, exposed), or PyTorch's context parallelism
    (all-gather rotater, K/V repeated to all heads, partial results merged in fp32)."""
    tensor_overlap: str = "userbuffers"
    """What `--tp-overlap` runs: Transformer Engine's userbuffers (ring-exchange all-gather GEMMs, pipelined
    reduce-scatter on 16 SMs) or PyTorch's symmetric-memory async TP (GEMMs split into tp chunks)."""
    pipeline_p2p: str = "overlapped"
    """Pipeline sends and receives: overlapped with the next chunk's compute (Megatron-Core's interleaved schedule
    with overlap_p2p_comm) or synchronous (1F1B: batched, each followed by a device synchronisation)."""
    compute_efficiency: float = 1.0
    """A factor on the system's matrix efficiency curve (and so its fused attention) for what this stack's kernels
    reach beyond what the model prices from the behaviours above: 1.0 in every shipped preset (nothing fitted);
    `calibrate --published` fits it from a few published or measured runs of the stack."""
    sources: str = ""
    """Where each behaviour comes from."""

    def replace(self, **changes: Any) -> StackSpec:
        return dataclasses.replace(self, **changes)


def stack_from_dict(data: dict[str, Any], source: str = "stack") -> StackSpec:
    """Validate a parsed TOML document and build the StackSpec."""
    known = {f.name for f in dataclasses.fields(StackSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(f"unknown key {unknown[0]!r} in {source}; known: {', '.join(sorted(known))}")
    if "name" not in data:
        raise UsageError(f"missing key 'name' in {source}")
    for key, choices in CHOICES.items():
        if key in data and data[key] not in choices:
            raise UsageError(f"{key} in {source} must be one of {', '.join(choices)}, got {data[key]!r}")
    fields = {k: str(v) for k, v in data.items() if k != "compute_efficiency"}
    factor = data.get("compute_efficiency", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 10:
        raise UsageError(f"compute_efficiency in {source} must be a number in (0, 10], got {factor!r}")
    return StackSpec(**fields, compute_efficiency=float(factor))


def stack_to_toml(stack: StackSpec, header: str = "") -> str:
    """TOML text that `load_stack` reads back to an equal StackSpec."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    for field in dataclasses.fields(StackSpec):
        value = getattr(stack, field.name)
        escaped = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
        lines.append(f"{field.name} = {repr(value) if isinstance(value, float) else chr(34) + escaped + chr(34)}")
    return "\n".join(lines) + "\n"


def _preset_files() -> dict[str, Any]:
    folder = resources.files("stepscope") / "data" / "stacks"
    return {entry.name[:-5]: entry for entry in folder.iterdir() if entry.name.endswith(".toml")}


def list_stacks() -> list[str]:
    """Names of the shipped stack presets."""
    return sorted(_preset_files())


_CACHE: dict[str, StackSpec] = {}


def load_stack(name_or_path: str | Path) -> StackSpec:
    """A preset by name or a TOML file by path (presets are read once)."""
    text = str(name_or_path)
    if text in _CACHE:
        return _CACHE[text]
    presets = _preset_files()
    if text in presets:
        try:
            data = tomllib.loads(presets[text].read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as error:  # pragma: no cover - shipped presets are tested
            raise UsageError(f"malformed TOML in stack preset {text}: {error}".splitlines()[0]) from None
        _CACHE[text] = stack_from_dict(data, f"stack preset {text}")
        return _CACHE[text]
    path = Path(text)
    if path.suffix == ".toml" and path.is_file():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
            raise UsageError(f"cannot read stack file {path}: {error}".splitlines()[0]) from None
        return stack_from_dict(data, str(path))
    raise UsageError(f"unknown stack {text!r}; presets: {', '.join(list_stacks())} (or a path to a .toml file)")
