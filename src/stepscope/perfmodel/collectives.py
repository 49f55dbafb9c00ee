"""α–β model of collectives on a two-tier network (scalar reference; `vectorized.py` has the array form).

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
  picks among A), D·(N−1)/N of them remote; S = the
  rank's tokens, one copy each: max(D·(N−1)/N·S/B_inter + α_inter, k·(g−1)/g·S/B_intra + α_intra) (the two
  tiers are pipelined: NVLink forwards what the NIC delivers); in one domain it is the all-to-all of k·S;
- point-to-point: α + S/B on the tier joining the two ranks.
B = tier bandwidth x tier efficiency (per GPU, unidirectional), α = tier latency.
"""

from __future__ import annotations

import math

from stepscope.spec.system import Network

KINDS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "dispatch", "p2p")


def members_per_domain(size: int, stride: int, domain_size: int) -> int:
    """How many of a group's `size` ranks (spaced `stride` apart) share one fast domain."""
    if size <= 1:
        return 1
    if stride >= domain_size:
        return 1
    if stride * size <= domain_size:
        return size
    return max(1, domain_size // stride)


def ring_all_reduce(nbytes: float, n: int, g: int, network: Network) -> float:
    if n <= 1:
        return 0.0
    domains = math.ceil(n / g)
    intra, inter = network.intra, network.inter
    t = 2 * (g - 1) / g * nbytes / intra.bytes_per_s + 2 * (g - 1) * intra.latency_s
    t += 2 * (domains - 1) / domains * (nbytes / g) / inter.bytes_per_s + 2 * (domains - 1) * inter.latency_s
    return t


def tree_all_reduce(nbytes: float, n: int, g: int, network: Network) -> float:
    if n <= 1:
        return 0.0
    tier = network.intra if g >= n else network.inter
    return 2 * math.ceil(math.log2(n)) * tier.latency_s + 2 * nbytes / tier.bytes_per_s


def all_reduce(nbytes: float, n: int, g: int, network: Network) -> float:
    """Seconds for an all-reduce of a `nbytes` buffer over n ranks, g per domain (best of ring and tree)."""
    if n <= 1:
        return 0.0
    return min(ring_all_reduce(nbytes, n, g, network), tree_all_reduce(nbytes, n, g, network))


def reduce_scatter(nbytes: float, n: int, g: int, network: Network) -> float:
    """Seconds for a reduce-scatter (or all-gather) whose total size is `nbytes`."""
    if n <= 1:
        return 0.0
    domains = math.ceil(n / g)
    intra, inter = network.intra, network.inter
    t = (g - 1) / g * nbytes / intra.bytes_per_s + (g - 1) * intra.latency_s
    t += (domains - 1) / domains * (nbytes / g) / inter.bytes_per_s + (domains - 1) * inter.latency_s
    return t


all_gather = reduce_scatter


def all_to_all(nbytes: float, n: int, g: int, network: Network) -> float:
    """Seconds for an all-to-all in which every rank sends a `nbytes` buffer split evenly over the n ranks."""
    if n <= 1:
        return 0.0
    intra, inter = network.intra, network.inter
    t = (g - 1) / n * nbytes / intra.bytes_per_s + (intra.latency_s if g > 1 else 0.0)
    return t + ((n - g) / n * nbytes / inter.bytes_per_s + inter.latency_s if n > g else 0.0)


def reachable_domains(domains: int, groups: int = 0, groups_per_token: int = 0) -> int:
    """Domains a token's experts may sit on: group-limited routing picks `groups_per_token` of `groups` equal
    expert groups, each spread over ceil(domains / groups) domains of the EP group; all domains without it."""
    if not groups:
        return domains
    return min(domains, groups_per_token * math.ceil(domains / groups))


def domains_reached(copies: float, allowed: int) -> float:
    """Mean distinct domains among `copies` uniform picks from `allowed` domains."""
    return allowed * (1.0 - (1.0 - 1.0 / allowed) ** copies)


def dispatch(nbytes: float, n: int, g: int, network: Network, copies: float = 1.0,
             reach: tuple[int, int] = (0, 0)) -> float:
    """Seconds for a deduplicating dispatch (or combine) of a rank's tokens (`nbytes`, one copy each) to
    `copies` experts each over n ranks, g per domain; `reach` = (expert groups, groups per token) of
    group-limited routing, (0, 0) without."""
    if n <= 1:
        return 0.0
    domains = math.ceil(n / g)
    if domains == 1:
        return all_to_all(copies * nbytes, n, g, network)
    remote = domains_reached(copies, reachable_domains(domains, *reach)) * (domains - 1) / domains
    inter = remote * nbytes / network.inter.bytes_per_s + network.inter.latency_s
    intra = copies * (g - 1) / g * nbytes / network.intra.bytes_per_s + (network.intra.latency_s if g > 1 else 0.0)
    return max(inter, intra)


def p2p(nbytes: float, same_domain: bool, network: Network) -> float:
    """Seconds to send `nbytes` from one rank to another."""
    tier = network.intra if same_domain else network.inter
    return tier.latency_s + nbytes / tier.bytes_per_s


def collective_time(kind: str, nbytes: float, n: int, g: int, network: Network, copies: float = 1.0,
                    reach: tuple[int, int] = (0, 0)) -> float:
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
        return p2p(nbytes, g >= 2, network)
    raise ValueError(f"unknown collective {kind!r}")
