"""Where a plan's work and groups sit: the geometry of one micro-batch on one GPU, the members of every group
inside one fast domain, the group sizes of the data-parallel and expert-parallel reductions. Over the arrays of
`Candidates` (one element per plan)."""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.perfmodel.model.candidates import Candidates
from stepscope.perfmodel.model.op_types import Geometry
from stepscope.perfmodel.model.ops import activation_precision
from stepscope.spec import Workload, bytes_per_element
from stepscope.spec.plan import ParallelPlan
from stepscope.spec.stack import load_stack


def geometry(c: Candidates, workload: Workload, flash_attention: bool) -> Geometry:
    """One micro-batch on one GPU of each plan of `c`, whose attention kind is `flash_attention`."""
    fp8 = c.fp8_recipe if workload.precision == "fp8" else None
    return Geometry(c.micro_batch.astype(float), workload.seq,
                    bytes_per_element(activation_precision(workload.precision)), c.tp.astype(float),
                    c.cp.astype(float), c.sequence_parallel, flash_attention, c.dropout, fp8, c.ep.astype(float),
                    c.expert_imbalance, c.dispatcher, c.expert_tp, load_stack(c.stack).context_parallel)


def plan_geometry(plan: ParallelPlan, workload: Workload) -> Geometry:
    """The geometry of one plan (arrays of one)."""
    return geometry(Candidates.from_plans([plan]), workload, plan.flash_attention)


def data_parallel_sizes(c: Candidates) -> dict[str, np.ndarray]:
    """Ranks of the gradient reductions: `dp_cp` (the dp x cp ranks holding the same weights: context-parallel
    ranks see other tokens of the same sequences), its ZeRO/FSDP `shard` group (the innermost `shard_group` of
    them; 0 = all) and the `replicas` of each shard, the `edp` ranks holding the same routed experts (dp x cp,
    x tp with whole experts, over ep)."""
    dp_cp = (c.dp * c.cp).astype(float)
    shard = np.where(c.shard_group > 0, c.shard_group, dp_cp).astype(float)
    folded = dp_cp * (c.tp if c.expert_tp == 1 else 1)
    return {"dp_cp": dp_cp, "shard": shard, "replicas": dp_cp / shard, "edp": folded / c.ep}


def group_layout(c: Candidates, domain_size: int) -> dict[str, Any]:
    """Members of each dimension's group inside one fast domain, from the plan's placement, of the
    gradient-reduction group `dp_cp` (dp x cp ranks: the product of the two, exact for power-of-two sizes), and
    of the ZeRO/FSDP shard group (`shard`, the innermost `plan.shard` of them) and its replica group
    (`replica`, one rank of every shard group); of the expert-parallel group (`ep`, the innermost `plan.ep` of
    the dp x cp ranks) and the expert-data-parallel group (`edp`, one rank of every EP group)."""
    layout = {dim: g.astype(float) for dim, g in c.members_per_domain(domain_size).items()}
    sizes = data_parallel_sizes(c)
    layout["dp_cp"] = layout["dp"] * layout["cp"]
    layout["shard"] = np.minimum(sizes["shard"], layout["dp_cp"])
    layout["replica"] = np.maximum(1.0, np.floor(layout["dp_cp"] / sizes["shard"]))
    folded = layout["dp_cp"] * (layout["tp"] if c.expert_tp == 1 else 1)  # the ranks EP is carved out of
    layout["ep"] = np.minimum(c.ep, folded)
    layout["edp"] = np.maximum(1.0, np.floor(folded / c.ep))
    return layout
