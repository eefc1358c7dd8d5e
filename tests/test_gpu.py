"""The real thing on a CUDA GPU (``pytest -m gpu``; ``make gpu-check`` runs them). Without CUDA
they skip, and tests/test_cuda_paths.py checks the same paths for device mix-ups through the
CUDA stand-in on the CPU."""
from __future__ import annotations

import pytest
import torch

from kdlab.engine import rollout
from kdlab.engine.data import ProblemPool, prompt_ids
from cells import cell
from kdlab.engine.distill import distill
from kdlab.engine.offpd import offpd_rollouts
from kdlab.evaluation.evaluate import accuracy, pass_at_ks
from kdlab.models.toy import build_model
from kdlab.tasks import get_task

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check)")]

SIZE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)
PROMPTS = ["c12 34 56>78:", "a1+2:", "m347,291:", "vhouse:"]


def test_cuda_graph_decode_matches_eager_static_and_transformers():
    """The graphed decode step gives the eager static step's logits and transformers' own
    KV-cached ones, step by step (fp32 on the GPU)."""
    model = build_model("llama", SIZE, seed=3).cuda().eval()
    prompts = [prompt_ids(p) for p in PROMPTS]
    feed = [torch.randint(3, 98, (len(prompts),), device="cuda") for _ in range(8)]
    with torch.no_grad():
        graphed = rollout._StaticStepper(model, prompts, len(feed), static=True, graph=True)
        eager = rollout._StaticStepper(model, prompts, len(feed), static=True, graph=False)
        ref = rollout._Stepper(model, prompts)
        assert graphed.graph is not None
        for tok in [None] + feed:
            if tok is not None:
                for st in (graphed, eager, ref):
                    st.feed(tok)
            torch.testing.assert_close(graphed.last, eager.last, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(graphed.last, ref.last, atol=2e-3, rtol=2e-3)


def test_greedy_rollouts_agree_between_cpu_and_gpu():
    model = build_model("llama", SIZE, seed=4).eval()
    prompts = [prompt_ids(p) for p in PROMPTS]
    cpu = rollout.sample(model, prompts, 24, greedy=True)
    gpu = rollout.sample(model.cuda(), prompts, 24, greedy=True)
    assert gpu.tokens.device.type == "cpu"
    assert (gpu.tokens == cpu.tokens).float().mean() > 0.9  # fp32 on both; rounding may flip a near tie


@pytest.mark.parametrize("policy,kl", [("off", "forward"), ("off", "reverse"), ("on", "forward"), ("on", "reverse"),
                                       ("lambda", "sf")])
def test_distillation_on_the_gpu(policy, kl):
    task = get_task("countdown-3")
    pool = ProblemPool(task, "train", 64, seed=0)
    teacher = build_model("llama", "nano", seed=1).to(torch.bfloat16).cuda().eval()
    student = build_model("llama", "nano", seed=0).cuda()
    offpd = offpd_rollouts(teacher, task, pool, 16, 1.0, seed=0, max_new_tokens=task.max_new_tokens)
    before = [p.detach().clone() for p in student.parameters()]
    res = distill(student, teacher, task, cell(policy=policy, kl=kl, lam=0.5, steps=3, batch_size=8, lr=1e-3,
                                                    fused_adamw=True, micro_batch_size=4),
                  offpd=offpd, pool=pool, progress=False)
    assert not res.collapsed and len(res.history) == 3
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in res.history)
    assert next(student.parameters()).device.type == "cuda"
    assert any(not torch.equal(a, b) for a, b in zip(before, student.parameters()))
    assert res.optimizer == "adamw-fused"


def test_evaluation_on_the_gpu():
    task = get_task("countdown-3")
    problems = ProblemPool(task, "test", 8, seed=0).problems
    model = build_model("llama", "nano", seed=0).cuda()
    assert 0.0 <= accuracy(model, task, problems) <= 1.0
    scores = pass_at_ks(model, task, problems, n=4, ks=(1, 4), seed=0)
    assert 0.0 <= scores[1] <= scores[4] <= 1.0
