"""The top plans of a search: each chunk keeps its k best distinct answers (ties collapse into the simplest plan
of them), and the chunks' answers are merged into the search's. Used by `search.py`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stepscope.perfmodel.model.candidates import Candidates


def scalar(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def rounded_speed(speed: np.ndarray) -> np.ndarray:
    """tokens/s as plans are compared: equal to 6 decimals is a tie (one answer, see `search`)."""
    return np.round(speed, 6)


def top_answers(cands: Candidates, out: dict[str, np.ndarray], ok: np.ndarray, k: int):
    """The k best distinct answers among the `ok` candidates, best first (by speed, then memory): one
    representative each, the simplest plan of its ties (lowest ZeRO stage, recompute mode, placement), and in
    out["plans"] how many candidates it stands for. Applied per chunk and again to merged lists, it gives
    the k best answers of the whole search with complete tie counts: an answer among the k best overall is
    among the k best of every chunk that holds it."""
    index = np.nonzero(ok)[0]
    plans = out["plans"][index] if "plans" in out else np.ones(len(index), dtype=np.int64)
    # rounded after selecting the feasible ones: the same values, without rounding the infeasible half
    speed, memory = rounded_speed(out["tokens_per_s"][index]), np.round(out["mem_GiB"][index], 9)
    # only candidates at or above the k-th best distinct speed can be among the k best answers; every speed
    # above the minimum of the best m is among them, so their k-th distinct one is the overall one
    m = min(4 * k, len(speed))
    distinct = np.unique(speed[np.argpartition(-speed, m - 1)[:m]])
    if len(distinct) < k:  # heavy ties: look at every distinct speed
        distinct = np.unique(speed)
    if len(distinct) >= k:  # (the k best speeds tied among themselves still leave out the slower rest)
        near_top = speed >= distinct[-k]
        index, plans, speed, memory = index[near_top], plans[near_top], speed[near_top], memory[near_top]
    order = np.lexsort((cands.placement[index], cands.recompute[index], cands.zero[index], memory, -speed))
    index, plans, speed, memory = index[order], plans[order], speed[order], memory[order]
    first = np.ones(len(index), dtype=bool)
    first[1:] = (speed[1:] != speed[:-1]) | (memory[1:] != memory[:-1])
    counts = np.bincount(np.cumsum(first) - 1, weights=plans).astype(np.int64)
    chosen = index[first][:k]
    kept = {key: value[chosen] for key, value in out.items() if key != "plans"}
    kept["plans"] = counts[:k]
    return (0.0, 0, cands.subset(chosen), kept)


def merge_answers(parts: Sequence[tuple], k: int):
    """Keep the k best of several partial top lists."""
    from stepscope.perfmodel.model.candidates import concatenate

    cands = concatenate([p[2] for p in parts])
    out = {key: np.concatenate([p[3][key] for p in parts]) for key in parts[0][3]}
    return top_answers(cands, out, np.ones(len(cands), dtype=bool), k)
