"""α–β model of collectives on a two-tier network, over numpy arrays (one element per plan).

A group of n ranks spans N = ceil(n/g) fast domains with g members in each. Hierarchical algorithms do
the intra-domain part on NVLink and the inter-domain part on each GPU's own NIC with 1/g of the data:
- ring all-reduce:  2(g−1)/g·S/B_intra + 2(g−1)·α_intra + 2(N−1)/N·(S/g)/B_inter + 2(N−1)·α_inter
  (the factor 2 holds in every case, also when the group fits in one tier; the published LBNL model
  dropped it there);
- tree all-reduce (what libraries pick for small messages): 2·ceil(log2 n)·α + 2·S/B on the slowest tier
  the group uses; the model takes the faster of ring and tree;
- reduce-scatter / all-gather (S = the total, gathered size): (g−1)/g·S/B_intra + (g−1)·α_intra
  + (N−1)/N·(S/g)/B_inter + (N−1)·α_inter;
- all-to-all (S = one rank's send buffer, nccl-tests' size; each peer gets S/n): the (g−1)/n·S bound for
  its own domain go over NVLink, the (n−g)/n·S for the others over its NIC, one after the other:
  (g−1)/n·S/B_intra + α_intra + (n−g)/n·S/B_inter + α_inter (a tier's α only where the group uses it); in
  one domain this is nccl-tests' (n−1)/n bus-bandwidth factor;
- deduplicated dispatch (DeepEP, HybridEP: Megatron-Core's flex dispatcher; DeepSeek-V3 §3.2.2): a token
  bound for k experts crosses the network once per destination domain and is fanned out there over NVLink.
  With the EP group over N domains and routing limited to A of them (group-limited routing: M of G expert
  groups, A = min(N, M·ceil(N/G))), a token reaches D = A·(1 − (1 − 1/A)^k) domains on average (k uniform
  picks among A), D·(N−1)/N of them remote; S = the rank's tokens, one copy each:
  max(D·(N−1)/N·S/B_inter + α_inter, k·(g−1)/g·S/B_intra + α_intra) (the two tiers are pipelined: NVLink
  forwards what the NIC delivers); in one domain it is the all-to-all of k·S;
- point-to-point: α + S/B on the tier joining the two ranks.
B = tier bandwidth x tier efficiency (per GPU, unidirectional), α = tier latency. A collective of one rank or of
no bytes takes no time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.spec.system import Network

KINDS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "dispatch", "p2p")


def members_per_domain(size: Any, stride: Any, domain_size: int) -> Any:
    """How many of a group's `size` ranks (spaced `stride` apart on rank numbers) share one fast domain."""
    size, stride = np.asarray(size), np.asarray(stride)
    inside = np.where(stride * size <= domain_size, size, np.maximum(1, domain_size // np.maximum(stride, 1)))
    return np.where((size <= 1) | (stride >= domain_size), 1, inside)


def _runs(nbytes: Any, n: Any) -> Any:
    return (np.asarray(n) > 1) & (np.asarray(nbytes) > 0)


def ring_all_reduce(nbytes: Any, n: Any, g: Any, network: Network) -> Any:
    domains = np.ceil(n / g)
    intra, inter = network.intra, network.inter
    return (2 * (g - 1) / g * nbytes / intra.bytes_per_s + 2 * (g - 1) * intra.latency_s
            + 2 * (domains - 1) / domains * (nbytes / g) / inter.bytes_per_s + 2 * (domains - 1) * inter.latency_s)


def tree_all_reduce(nbytes: Any, n: Any, g: Any, network: Network) -> Any:
    steps = 2 * np.ceil(np.log2(np.maximum(n, 1)))
    one_domain = np.asarray(g) >= np.asarray(n)
    intra, inter = network.intra, network.inter
    return np.where(one_domain, steps * intra.latency_s + 2 * nbytes / intra.bytes_per_s,
                    steps * inter.latency_s + 2 * nbytes / inter.bytes_per_s)


def all_reduce(nbytes: Any, n: Any, g: Any, network: Network) -> Any:
    """Seconds for an all-reduce of a `nbytes` buffer over n ranks, g per domain (best of ring and tree)."""
    t = np.minimum(ring_all_reduce(nbytes, n, g, network), tree_all_reduce(nbytes, n, g, network))
    return np.where(_runs(nbytes, n), t, 0.0)


def reduce_scatter(nbytes: Any, n: Any, g: Any, network: Network) -> Any:
    """Seconds for a reduce-scatter (or all-gather) whose total size is `nbytes`."""
    domains = np.ceil(n / g)
    intra, inter = network.intra, network.inter
    t = ((g - 1) / g * nbytes / intra.bytes_per_s + (g - 1) * intra.latency_s
         + (domains - 1) / domains * (nbytes / g) / inter.bytes_per_s + (domains - 1) * inter.latency_s)
    return np.where(_runs(nbytes, n), t, 0.0)


all_gather = reduce_scatter


def all_to_all(nbytes: Any, n: Any, g: Any, network: Network) -> Any:
    """Seconds for an all-to-all in which every rank sends a `nbytes` buffer split evenly over the n ranks."""
    intra, inter = network.intra, network.inter
    n_safe = np.maximum(n, 1)
    t = (g - 1) / n_safe * nbytes / intra.bytes_per_s + np.where(np.asarray(g) > 1, intra.latency_s, 0.0)
    t = t + np.where(np.asarray(n) > np.asarray(g), (n - g) / n_safe * nbytes / inter.bytes_per_s + inter.latency_s,
                     0.0)
    return np.where(_runs(nbytes, n), t, 0.0)


def reachable_domains(domains: Any, groups: int = 0, groups_per_token: int = 0) -> Any:
    """Domains a token's experts may sit on: group-limited routing picks `groups_per_token` of `groups` equal
    expert groups, each spread over ceil(domains / groups) domains of the EP group; all domains without it."""
    if not groups:
        return domains
    return np.minimum(domains, groups_per_token * np.ceil(domains / groups))


def domains_reached(copies: float, allowed: Any) -> Any:
    """Mean distinct domains among `copies` uniform picks from `allowed` domains."""
    return allowed * (1.0 - (1.0 - 1.0 / allowed) ** copies)


def dispatch(nbytes: Any, n: Any, g: Any, network: Network, copies: float = 1.0,
             reach: tuple[int, int] = (0, 0)) -> Any:
    """Seconds for a deduplicating dispatch (or combine) of a rank's tokens (`nbytes`, one copy each) to
    `copies` experts each over n ranks, g per domain; `reach` = (expert groups, groups per token) of
    group-limited routing, (0, 0) without."""
    domains = np.ceil(n / g)
    remote = domains_reached(copies, reachable_domains(domains, *reach)) * (domains - 1) / domains
    inter = remote * nbytes / network.inter.bytes_per_s + network.inter.latency_s
    intra = (copies * (g - 1) / g * nbytes / network.intra.bytes_per_s
             + np.where(np.asarray(g) > 1, network.intra.latency_s, 0.0))
    t = np.where(domains == 1, all_to_all(copies * nbytes, n, g, network), np.maximum(inter, intra))
    return np.where(_runs(nbytes, n), t, 0.0)


def p2p(nbytes: Any, same_domain: Any, network: Network) -> Any:
    """Seconds to send `nbytes` from one rank to another."""
    intra, inter = network.intra, network.inter
    return np.where(same_domain, intra.latency_s + nbytes / intra.bytes_per_s,
                    inter.latency_s + nbytes / inter.bytes_per_s)


def collective_time(kind: str, nbytes: Any, n: Any, g: Any, network: Network, copies: float = 1.0,
                    reach: tuple[int, int] = (0, 0)) -> Any:
    """By kind (p2p: same domain when g >= 2, i.e. both ends share one; `copies` and `reach` are a
    deduplicating dispatch's)."""
    if kind == "all-reduce":
        return all_reduce(nbytes, n, g, network)
    if kind in ("reduce-scatter", "all-gather"):
        return reduce_scatter(nbytes, n, g, network)
    if kind == "all-to-all":
        return all_to_all(nbytes, n, g, network)
    if kind == "dispatch":
        return dispatch(nbytes, n, g, network, copies, reach)
    if kind == "p2p":
        return p2p(nbytes, np.asarray(g) >= 2, network)
    raise ValueError(f"unknown collective {kind!r}")
