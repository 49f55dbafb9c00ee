"""The flash backends inside TransformerLM and `stepscope step`: same logits and gradients as sdpa."""

import pytest
import torch

from stepscope.nn import TransformerLM, lm_loss
from stepscope.nn.attention_reference import relative_error
from stepscope.results.store import read_records
from stepscope.spec import get_preset


def logits_and_grads(spec, attention, tokens, state):
    model = TransformerLM(spec, attention=attention)
    model.load_state_dict(state)
    logits = model(tokens)
    lm_loss(logits, tokens.roll(-1, dims=1)).backward()
    return logits.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("backend", ["flash-torch", "flash-triton"])
def test_a_model_step_with_a_flash_backend_matches_sdpa(backend):
    torch.manual_seed(0)
    spec = get_preset("tiny", n_kv_heads=2)  # grouped KV heads: the model repeats them before attention
    state = TransformerLM(spec).state_dict()
    tokens = torch.randint(0, spec.vocab_size, (2, 37))  # 37: not a multiple of any tile
    sdpa_logits, sdpa_grads = logits_and_grads(spec, "sdpa", tokens, state)
    logits, grads = logits_and_grads(spec, backend, tokens, state)
    assert relative_error(logits, sdpa_logits) < 1e-5
    worst = max(relative_error(grads[name], sdpa_grads[name]) for name in sdpa_grads)
    assert worst < 1e-4, worst


def test_step_command_runs_with_each_flash_backend(cli, tmp_path):
    code, out, err = cli("step", "--model", "tiny", "--batch", "2", "--seq", "24", "--mode", "fwd-bwd",
                         "--attention", "flash-torch,flash-triton", "--warmup", "0", "--iters", "1",
                         "--out", tmp_path, "--format", "csv")
    assert code == 0, err
    records = read_records(tmp_path / "step.jsonl")
    assert [r["config"]["attention"] for r in records] == ["flash-torch", "flash-triton"]
    assert all(r["status"] == "ok" and r["metrics"]["backward_ms_median"] > 0 for r in records)
