"""Every hot path with the models on a GPU, checked without one.

The models' parameters are moved onto ``cuda:0`` as the CUDA stand-in (tests/cuda_stand_in.py):
real values computed on the CPU by tensors that say they live on the GPU and refuse a mix with
CPU tensors as CUDA does. A tensor left on the CPU where the GPU's is needed (the mask that
crashed the first H200 run) raises here as it raised there. The decode loop's static mode (the
one a GPU uses, CUDA graph aside) is checked against transformers on the CPU.
"""
from __future__ import annotations

import random

import pytest
import torch

from cuda_stand_in import OnCuda, cuda_stand_in, to_stand_in
from kdlab.engine import rollout
from kdlab.engine.batching import pad_left, pad_right, positions, response_logits
from kdlab.engine.data import ProblemPool
from cells import cell
from kdlab.engine.distill import distill
from kdlab.engine.offpd import offpd_rollouts
from kdlab.evaluation.evaluate import accuracy, pass_at_ks
from kdlab.core.schema import LOSS_KINDS
from kdlab.core.metrics import update_sparsity
from kdlab.models.toy import build_model
from kdlab.tasks import get_task
from kdlab.engine.data import prompt_ids


def _models():
    teacher = to_stand_in(build_model("llama", "nano", seed=1).to(torch.bfloat16).eval())
    student = to_stand_in(build_model("llama", "nano", seed=0))
    return student, teacher


# ---------------------------------------------------------------------------------------------
# the stand-in itself
# ---------------------------------------------------------------------------------------------

def test_the_stand_in_refuses_what_cuda_refuses_and_keeps_real_values():
    with cuda_stand_in():
        a = torch.ones(2, 3, device="cuda")
        assert a.device.type == "cuda" and isinstance(a, OnCuda)
        assert float(a[:, 1:].sum()) == 4.0
        with pytest.raises(RuntimeError, match="same device"):
            torch.cat([a, torch.ones(2, 3)])
        with pytest.raises(RuntimeError, match="same device"):
            a @ torch.ones(3, 2)
        assert (a + torch.tensor(1.0)).device.type == "cuda"  # a 0-dim CPU tensor mixes, as on CUDA
        b = a.cpu()
        assert type(b) is torch.Tensor and b.device.type == "cpu"
        x = torch.ones(3, device="cuda", requires_grad=True)
        (x * 2).sum().backward()
        assert x.grad.device.type == "cuda" and torch.equal(x.grad.cpu(), torch.full((3,), 2.0))
        gen = torch.Generator(device="cuda").manual_seed(0)
        with pytest.raises(RuntimeError, match="generator"):
            torch.multinomial(torch.ones(4), 1, generator=gen)


def test_the_stand_in_catches_the_mask_left_on_the_cpu():
    """The bug of the first H200 run, reconstructed: a mask built on the CPU next to the
    prompt's on the model's device."""
    student, _ = _models()
    p, pm = pad_left([prompt_ids("a1+2:"), prompt_ids("c12 34 56>78:")])
    r, rm = pad_right([[5, 6, 7], [8, 9]])
    with cuda_stand_in():
        device = next(student.parameters()).device
        with pytest.raises(RuntimeError, match="same device"):
            torch.cat([pm.to(device), torch.ones_like(rm[:, :-1])], dim=1)
        out = response_logits(student, p, pm, r, rm)  # the fixed function
        assert out.device.type == "cuda"
    ref = response_logits(build_model("llama", "nano", seed=0), p, pm, r, rm)
    assert torch.equal(out.cpu(), ref)


# ---------------------------------------------------------------------------------------------
# the hot paths
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lam,greedy", [(1.0, False), (-1.0, False), (0.5, False), (1.0, True)])
def test_sampling_on_the_gpu_matches_the_cpu(lam, greedy):
    """The sampler with both models on the GPU (a CUDA generator, the lambda mixture, stop ids,
    the static decode mode and the stop check every STOP_CHECK steps) draws what the CPU does."""
    prompts = [prompt_ids(x) for x in ("a1+2:", "c12 34 56>78:", "m347,291:")]
    kw = dict(lam=lam, greedy=greedy, logratio_clip=5.0, plausibility_alpha=0.1, temperature=1.0)
    ref = rollout.sample(build_model("llama", "nano", seed=0), prompts, 24,
                         teacher=build_model("llama", "nano", seed=1).to(torch.bfloat16),
                         generator=torch.Generator().manual_seed(3), **kw)
    student, teacher = _models()
    with cuda_stand_in():
        gen = torch.Generator(device="cuda").manual_seed(3)
        ro = rollout.sample(student, prompts, 24, teacher=teacher, generator=gen, **kw)
    assert type(ro.tokens) is torch.Tensor and ro.tokens.device.type == "cpu"
    assert torch.equal(ro.tokens, ref.tokens) and torch.equal(ro.mask, ref.mask)


@pytest.mark.parametrize("policy,kl", [("off", "forward"), ("on", "reverse"), ("lambda", "sf"), ("on", "k3"),
                                       ("off", "jsd"), ("on", "forward"), ("lambda", "forward")])
def test_distillation_runs_on_the_gpu_and_matches_the_cpu(policy, kl):
    """A whole run (off-policy pool and teacher-logit cache, on-policy sampling, the loss and
    its estimators, micro-batches, fused AdamW, warm-up) with both models on the GPU: no device
    mix, and the history of the CPU run up to rounding (off the CPU the models keep their SDPA
    attention instead of the CPU's eager one; the gradients are bf16)."""
    assert kl in LOSS_KINDS
    task = get_task("countdown-3")
    pool = ProblemPool(task, "train", 64, seed=0)
    # lambda + forward without micro-batches: the step reads the rollout's teacher logits (on the GPU)
    mb = 0 if (policy, kl) == ("lambda", "forward") else 2
    cfg = dict(policy=policy, kl=kl, lam=0.5, steps=2, batch_size=4, fused_adamw=True, warmup=2,
               micro_batch_size=mb, compute_dtype="fp32")

    def run(student, teacher):
        offpd = offpd_rollouts(teacher, task, pool, 8, 1.0, seed=0, max_new_tokens=task.max_new_tokens)
        return distill(student, teacher, task, cell(**cfg), offpd=offpd, pool=pool, progress=False)

    ref = run(build_model("llama", "nano", seed=0), build_model("llama", "nano", seed=1).to(torch.bfloat16).eval())
    student, teacher = _models()
    with cuda_stand_in():
        res = run(student, teacher)
        assert next(student.parameters()).device.type == "cuda"
    assert len(res.history) == len(ref.history) == 2
    for got, want in zip(res.history, ref.history):
        assert got["length"] == want["length"]
        for key, rel in (("loss", 1e-3), ("forward_kl", 1e-3), ("reverse_kl", 1e-3), ("grad_norm", 0.1)):
            assert got[key] == pytest.approx(want[key], rel=rel, abs=1e-6), key


def test_evaluation_pass_at_k_and_sparsity_on_the_gpu():
    task = get_task("countdown-3")
    problems = ProblemPool(task, "test", 6, seed=0).problems
    cpu_model = build_model("llama", "nano", seed=0)
    ref_acc = accuracy(cpu_model, task, problems)
    ref_pass = pass_at_ks(cpu_model, task, problems, n=4, ks=(1, 2), seed=0)
    student, _ = _models()
    before = {k: v.detach().clone() for k, v in student.named_parameters()}
    with cuda_stand_in():
        acc = accuracy(student, task, problems)
        got = pass_at_ks(student, task, problems, n=4, ks=(1, 2), seed=0)
        with torch.no_grad():
            next(student.parameters()).add_(1.0)
        sparsity = update_sparsity(before, student)
    assert acc == ref_acc and got == ref_pass
    assert 0.0 < sparsity < 1.0


# ---------------------------------------------------------------------------------------------
# the GPU's decode mode, on the CPU
# ---------------------------------------------------------------------------------------------

def _decode_case(family: str, heads: int, kv: int, seed: int, steps: int):
    """A small fp32 model of ``family`` (grouped-query with ``kv`` key/value heads), three left-padded
    prompts and ``steps`` random tokens to feed them."""
    model = build_model(family, dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=heads,
                                     num_key_value_heads=kv, intermediate_size=96), seed=3).eval()
    prompts = [prompt_ids("c12 34 56>78:"), prompt_ids("a1+2:"), prompt_ids("vhouse:")]
    rng = random.Random(seed)
    return model, prompts, [torch.tensor([rng.randrange(3, 98) for _ in prompts]) for _ in range(steps)]


@pytest.mark.parametrize("family,heads,kv", [("llama", 4, 2), ("qwen2", 4, 1)])
def test_static_decode_mode_matches_the_sliced_one_and_transformers(family, heads, kv):
    """The GPU's static mode (all columns attended, the unwritten ones masked, the column held
    in a device tensor) gives the logits of the CPU's sliced mode and of transformers' own
    KV-cached decoding, step by step (fp32)."""
    model, prompts, feed = _decode_case(family, heads, kv, seed=0, steps=6)
    with torch.no_grad():
        static = rollout._StaticStepper(model, prompts, len(feed), static=True, graph=False)
        sliced = rollout._StaticStepper(model, prompts, len(feed), static=False)
        ref = rollout._Stepper(model, prompts)
        for tok in [None] + feed:
            if tok is not None:
                for st in (static, sliced, ref):
                    st.feed(tok)
            assert torch.allclose(static.last, sliced.last, atol=1e-5), (static.last - sliced.last).abs().max()
            assert torch.allclose(static.last, ref.last, atol=1e-4), (static.last - ref.last).abs().max()


@pytest.mark.parametrize("family,heads,kv", [("llama", 4, 2), ("qwen2", 4, 1)])
def test_sdpa_attention_in_the_model_dtype_matches_the_float32_one(family, heads, kv):
    """The CUDA decoder's attention (``sdpa``: cache in the model dtype, scaled_dot_product_attention)
    computes the CPU's float32 baddbmm attention: equal to 1e-5 in fp32, both decode modes, with
    left-padded prompts (queries with no key to attend in the prompt pass stay finite)."""
    model, prompts, feed = _decode_case(family, heads, kv, seed=1, steps=5)
    with torch.no_grad():
        for static in (True, False):
            fused = rollout._StaticStepper(model, prompts, len(feed), static=static, graph=False, sdpa=True)
            plain = rollout._StaticStepper(model, prompts, len(feed), static=static, graph=False, sdpa=False)
            assert fused.keys[0].dtype == torch.float32 and plain.keys[0].dtype == torch.float32
            for tok in [None] + feed:
                if tok is not None:
                    fused.feed(tok)
                    plain.feed(tok)
                assert torch.isfinite(fused.last).all()
                torch.testing.assert_close(fused.last, plain.last, atol=1e-5, rtol=1e-5)


def test_the_gpu_decoder_keeps_a_model_dtype_cache_and_follows_transformers_decoding():
    """On CUDA (the stand-in) the static decoder of a bf16 model keeps its key/value cache in bf16
    and attends with SDPA; step by step its logits follow transformers' own KV-cached bf16
    decoding on the same device to bf16 precision, and its greedy tokens are transformers'."""
    def bf16_model():
        return build_model("llama", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=96), seed=5).to(torch.bfloat16).eval()
    prompts = [prompt_ids("c12 34 56>78:"), prompt_ids("a1+2:"), prompt_ids("vhouse:")]
    model = to_stand_in(bf16_model())
    with cuda_stand_in(), torch.no_grad():
        fast = rollout._StaticStepper(model, prompts, 8)
        ref = rollout._Stepper(model, prompts)
        assert (fast.static, fast.sdpa, fast.graph) == (True, True, None)
        assert fast.keys[0].dtype == torch.bfloat16 and fast.keys[0].device.type == "cuda"
        for _ in range(8):
            torch.testing.assert_close(fast.last.cpu(), ref.last.cpu(), atol=0.1, rtol=0.05)
            tok = ref.last.argmax(-1)
            assert torch.equal(fast.last.argmax(-1).cpu(), tok.cpu())
            fast.feed(tok)
            ref.feed(tok)
    with torch.no_grad():  # the CPU keeps its float32 attention
        assert rollout._StaticStepper(bf16_model(), prompts, 8).keys[0].dtype == torch.float32


def test_the_stop_check_every_few_steps_gives_the_same_rollout(monkeypatch):
    """Checking "every row has stopped" every STOP_CHECK steps (a GPU's setting) and cutting the
    columns decoded after, gives the rollout of checking every step."""
    model = build_model("llama", "nano", seed=0)
    prompts = [prompt_ids(x) for x in ("a1+2:", "c12 34 56>78:")]
    every = rollout.sample(model, prompts, 40, greedy=True)
    monkeypatch.setattr(rollout, "STOP_CHECK", 7)
    with cuda_stand_in():
        sparse = rollout.sample(to_stand_in(build_model("llama", "nano", seed=0)), prompts, 40, greedy=True)
    assert torch.equal(every.tokens, sparse.tokens) and torch.equal(every.mask, sparse.mask)


def test_positions_and_padding_helpers_stay_on_the_device_they_are_given():
    with cuda_stand_in():
        ids, mask = pad_left([[1, 2], [3]])
        pos = positions(mask.to("cuda"))
        assert pos.device.type == "cuda"


def test_sft_on_the_gpu_matches_the_cpu():
    """Teacher and student-base fine-tuning (micro-batches, autocast on the model's device)."""
    from kdlab.engine.sft import SFTSchedule, sft

    task = get_task("countdown-3")
    sched = SFTSchedule(steps=2, batch_size=4, lr=1e-3, warmup=1, pool_size=32, micro_batch_size=2,
                        autocast_bf16=False)
    ref = sft(build_model("llama", "nano", seed=0), [(task, 1.0)], sched, progress=False)
    with cuda_stand_in():
        model = to_stand_in(build_model("llama", "nano", seed=0))
        got = sft(model, [(task, 1.0)], sched, progress=False)
        assert next(model.parameters()).device.type == "cuda"
    assert got[0]["loss"] == pytest.approx(ref[0]["loss"], rel=1e-6)
    assert got[1]["loss"] == pytest.approx(ref[1]["loss"], rel=1e-5)


def test_the_gradient_experiment_on_the_gpu():
    """The gradient notebook's measurement (pi_lambda samples, both models' logits, importance
    weights, functional and parameter-space update distances) with the models on the GPU."""
    from kdlab.engine.gradients import demo_models, update_distance_vs_tv

    prompts = [prompt_ids(x) for x in ("a1+2:", "c12 34 56>78:")]
    kw = dict(samples_per_prompt=2, max_new_tokens=6, seed=0)
    ref = update_distance_vs_tv(*demo_models(), prompts, [-1.0, 1.0], **kw)
    with cuda_stand_in():
        student, teacher = (to_stand_in(m) for m in demo_models())
        got = update_distance_vs_tv(student, teacher, prompts, [-1.0, 1.0], **kw)
    assert list(got.columns) == list(ref.columns) and len(got) == len(ref) > 0
    num = got.select_dtypes("number").columns
    assert got[num].to_numpy() == pytest.approx(ref[num].to_numpy(), rel=1e-4, abs=1e-6)


def test_the_shared_offpd_teacher_logits_on_the_gpu():
    """The pool's teacher logits computed once on the GPU and read by a run (also from a store
    saved on the CPU, as the study's cache holds it)."""
    from kdlab.engine.offpd import offpd_teacher_logits

    task = get_task("countdown-3")
    pool = ProblemPool(task, "train", 64, seed=0)
    student, teacher = _models()
    with cuda_stand_in():
        offpd = offpd_rollouts(teacher, task, pool, 8, 1.0, seed=0, max_new_tokens=task.max_new_tokens)
        store = offpd_teacher_logits(teacher, offpd)
        assert store.device.type == "cuda"
        res = distill(student, teacher, task, cell(steps=2, batch_size=4), offpd=offpd, progress=False,
                      offpd_teacher_logits=store.cpu())
    assert [h["teacher_cached"] for h in res.history] == [1.0, 1.0]


def test_rlvr_on_the_gpu_samples_there_and_matches_the_cpu(monkeypatch):
    """GRPO with the policy on the GPU: its rollouts draw with a generator on the model's device (a
    CPU generator would copy every token's (B, V) probabilities to the host), no device mix in
    the loss, the KL penalty and the one read per epoch, and the CPU run's history."""
    from kdlab.engine import rlvr
    from kdlab.engine.rlvr import RLVRConfig, grpo_train

    task = get_task("countdown-3")
    pool = ProblemPool(task, "train", 32, seed=0)
    cfg = RLVRConfig(steps=2, prompts_per_step=2, group_size=3, lr=1e-3, seed=0, dtype="fp32", kl_coef=0.1,
                     inner_epochs=2)
    ref = grpo_train(build_model("llama", "nano", seed=0), task, cfg, pool, progress=False)
    devices = []
    real_sample = rlvr.sample

    def recording(*args, **kw):
        devices.append(kw["generator"].device.type)
        return real_sample(*args, **kw)

    monkeypatch.setattr(rlvr, "sample", recording)
    with cuda_stand_in():
        model = to_stand_in(build_model("llama", "nano", seed=0))
        got = grpo_train(model, task, cfg, pool, progress=False)
        assert next(model.parameters()).device.type == "cuda"
    assert devices == ["cuda", "cuda"]
    assert len(got["history"]) == len(ref["history"]) == 2 and not got["nan"]
    for g, r in zip(got["history"], ref["history"]):
        assert g["reward_mean"] == r["reward_mean"] and g["length"] == r["length"]
        for key in ("loss", "ratio_mean", "kl", "grad_norm"):
            assert g[key] == pytest.approx(r[key], rel=1e-4, abs=1e-6), key


def test_a_study_on_several_gpus_runs_one_worker_per_gpu(monkeypatch):
    """Worker i of a real profile on ``auto`` / ``cuda`` sees GPU i alone (round robin past the
    count; within an existing CUDA_VISIBLE_DEVICES list); one GPU, one worker, a named GPU or a
    toy profile leave the environment as it is."""
    from kdlab.study import materials
    from kdlab.study.config import load_profile
    from kdlab.study.kernels import _kernel_env
    from kdlab.study.preflight import worker_gpus

    toy = load_profile("params/tiny.yaml")
    assert worker_gpus(toy, 4, device_count=8) == [None] * 4
    monkeypatch.setattr(materials, "is_real", lambda p: True)
    real = load_profile("params/tiny.yaml")
    assert real.pretrained.device == "auto"
    assert worker_gpus(real, 3, device_count=8, visible="") == ["0", "1", "2"]
    assert worker_gpus(real, 5, device_count=2, visible="") == ["0", "1", "0", "1", "0"]
    assert worker_gpus(real, 2, device_count=2, visible="4,6") == ["4", "6"]
    assert worker_gpus(real, 2, device_count=1, visible="") == [None, None]
    assert worker_gpus(real, 1, device_count=8, visible="") == [None]
    assert worker_gpus(load_profile("params/tiny.yaml", {"pretrained.device": "cuda:1"}), 2, device_count=8) == [None] * 2
    assert worker_gpus(real, 2, visible="") == [None, None]  # this machine: no GPU
    assert _kernel_env(1, "3")["CUDA_VISIBLE_DEVICES"] == "3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert _kernel_env(1)["CUDA_VISIBLE_DEVICES"] == "7"
