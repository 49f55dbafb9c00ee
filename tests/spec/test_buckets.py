"""The bucket planner: PyTorch DDP's GPT-2 layout, the strict cap, dtypes, and bad input.
(That the `torch` rule matches what DDP itself reports on a real process group is checked in test_ddp.py.)"""

import itertools
import random

import pytest
import torch

from stepscope.errors import UsageError
from stepscope.nn import TransformerLM
from stepscope.spec import get_preset
from stepscope.spec.buckets import MiB, bucket_numels, describe, module_entries, plan_buckets


@pytest.fixture(scope="module")
def gpt2():
    with torch.device("meta"):  # shapes only: no 500 MB of weights
        return TransformerLM(get_preset("gpt2"))


def test_torch_rule_reproduces_ddp_on_gpt2_small_at_25_mib(gpt2):
    buckets = plan_buckets(gpt2, 25, "torch")
    assert sum(bucket_numels(buckets)) == 124_439_808
    assert bucket_numels(buckets) == [7_087_872] * 12 + [39_385_344]
    assert describe(buckets) == "13 buckets: 12 x 7,087,872 + 1 x 39,385,344 elements"
    # each block's bucket is shifted by one LayerNorm: the first holds the final norm, the last the
    # first block's ln_1, the position table and the (tied) token embedding
    assert buckets[0].names[:2] == ("norm_f.bias", "norm_f.weight")
    assert buckets[0].names[-1] == "blocks.11.attn.qkv.weight"
    assert buckets[-1].names == ("blocks.0.norm1.bias", "blocks.0.norm1.weight", "pos_emb.weight",
                                 "tok_emb.weight")
    # PyTorch's default first bucket (1 MiB, used when bucket_cap_mb is not given) can be modelled too
    assert bucket_numels(plan_buckets(gpt2, 25, "torch", first_cap_mb=1))[0] == 2_361_600


def test_plain_lists_in_registration_order_give_the_same_plan(gpt2):
    entries = [(e.name, e.numel, "fp32") for e in module_entries(gpt2)]
    assert plan_buckets(entries, 25, "torch") == plan_buckets(gpt2, 25, "torch")


@pytest.mark.parametrize("cap_mb", [0.001, 0.01, 0.05, 1.0])
def test_strict_rule_never_exceeds_the_cap_except_single_large_tensors(cap_mb):
    rng = random.Random(cap_mb)
    entries = [(f"t{i}", rng.choice([1, 7, 100, 1000, 5000, 40000]), "float32") for i in range(300)]
    buckets = plan_buckets(entries, cap_mb, "strict")
    assert [n for b in buckets for n in b.names] == [name for name, _, _ in reversed(entries)]
    for bucket in buckets:
        assert bucket.nbytes <= cap_mb * MiB or len(bucket.names) == 1
    for before, after in itertools.pairwise(buckets):  # closed only because the next tensor did not fit
        assert before.nbytes + after.numels[0] * 4 > cap_mb * MiB
    torch_rule = plan_buckets(entries, cap_mb, "torch")
    assert all(b.nbytes >= cap_mb * MiB for b in torch_rule[:-1])  # torch closes once the cap is reached
    assert all(b.nbytes - b.numels[-1] * 4 < cap_mb * MiB for b in torch_rule)


def test_no_cap_is_one_bucket_and_dtypes_never_mix():
    entries = [("a", 10, "float32"), ("b", 20, "bfloat16"), ("c", 30, "float32"), ("d", 40, torch.bfloat16)]
    (single,) = plan_buckets(entries[::2], None, "strict")
    assert single.names == ("c", "a") and single.numel == 40
    mixed = plan_buckets(entries, None, "torch")
    assert [(b.names, b.dtype) for b in mixed] == [(("d", "b"), "bfloat16"), (("c", "a"), "float32")]
    small = plan_buckets(entries, 100 / MiB, "strict")  # 100 bytes: 25 fp32 or 50 bf16 elements
    assert [(b.names, b.nbytes) for b in small] == [(("d",), 80), (("c",), 120), (("b",), 40), (("a",), 40)]


@pytest.mark.parametrize("args, message", [
    (([("a", 4, "float32")], 0), "positive number of MiB"),
    (([("a", 4, "float32")], 1, "loose"), "unknown bucket rule"),
    (([("a", 4, "float33")], 1), "unknown dtype"),
    (([("a", -4, "float32")], 1), "invalid element count"),
    (([("a", 4)], 1), "expects (name, numel, dtype)"),
])
def test_bad_input_is_a_usage_error(args, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_buckets(*args)
