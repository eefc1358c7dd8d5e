"""The distillation engine end to end on nano models (untrained: this checks mechanics, not learning)."""
import math

import pytest
import torch

from kdlab.engine.data import ProblemPool
from cells import cell
from kdlab.engine.distill import distill
from kdlab.engine.offpd import offpd_rollouts
from kdlab.core.metrics import update_sparsity
from kdlab.models.toy import build_model
from kdlab.tasks import get_task


@pytest.fixture(scope="module")
def setup():
    task = get_task("countdown-3")
    pool = ProblemPool(task, "train", 64, seed=0)
    teacher = build_model("llama", "nano", seed=1).to(torch.bfloat16).eval()
    offpd = offpd_rollouts(teacher, task, pool, 32, 1.0, seed=0, max_new_tokens=task.max_new_tokens)
    return task, pool, teacher, offpd


def run(setup, **kw):
    task, pool, teacher, offpd = setup
    student = build_model("llama", "nano", seed=0)
    lr = kw.pop("force_lr", None)
    cfg = cell(steps=3, batch_size=4, **kw)
    if lr is not None:  # a rate beyond the rule (0, 1], set past the check, to make the run diverge
        cfg.lr = lr
    before = {k: v.detach().to(torch.bfloat16 if cfg.dtype == "bf16" else torch.float32).clone()
              for k, v in student.named_parameters()}
    res = distill(student, teacher, task, cfg, offpd=offpd, pool=pool, progress=False)
    return student, before, res


@pytest.mark.parametrize("policy", ["off", "on"])
@pytest.mark.parametrize("kl", ["forward", "reverse"])
def test_two_by_two_runs_and_records_history(setup, policy, kl):
    student, before, res = run(setup, policy=policy, kl=kl, lr=1e-3)
    assert not res.collapsed and len(res.history) == 3
    h = res.history[-1]
    for key in ("loss", "forward_kl", "reverse_kl", "grad_norm", "entropy", "length", "lr"):
        assert key in h
    assert h["forward_kl"] >= 0 and h["reverse_kl"] >= 0
    # the loss IS the chosen direction's KL on the batch (before the step)
    first = res.history[0]
    assert math.isclose(first["loss"], first[f"{kl}_kl"], rel_tol=1e-3, abs_tol=1e-4)
    assert next(student.parameters()).dtype == torch.bfloat16
    assert 0.0 <= update_sparsity(before, student) < 1.0
    if policy == "off":
        assert math.isnan(h["entropy"])
    else:
        assert h["entropy"] > 0


def test_same_seed_same_result_and_other_seed_differs(setup):
    a = run(setup, policy="on", kl="reverse", lr=1e-3, seed=7)
    b = run(setup, policy="on", kl="reverse", lr=1e-3, seed=7)
    c = run(setup, policy="on", kl="reverse", lr=1e-3, seed=8)
    assert [h["loss"] for h in a[2].history] == [h["loss"] for h in b[2].history]
    assert all(torch.equal(x, y) for x, y in zip(a[0].parameters(), b[0].parameters()))
    assert [h["loss"] for h in a[2].history] != [h["loss"] for h in c[2].history]


def test_lambda_policy_and_other_losses(setup):
    for kl in ("jsd", "k1", "k3"):
        _, _, res = run(setup, policy="lambda", lam=0.5, kl=kl, lr=1e-3)
        assert not res.collapsed and all(math.isfinite(h["loss"]) for h in res.history)


def test_tiny_lr_in_bf16_leaves_weights_untouched_but_fp32_moves_them(setup):
    """bf16 weights with no master copy lose updates below one bf16 step: sparsity ~ 1."""
    s16, b16, _ = run(setup, policy="off", kl="forward", lr=1e-9, grad_clip=None)
    assert update_sparsity(b16, s16) > 0.99
    s32, b32, _ = run(setup, policy="off", kl="forward", lr=1e-9, grad_clip=None, dtype="fp32", )
    assert next(s32.parameters()).dtype == torch.float32
    assert update_sparsity(b32, s32, tol=1e-12) < 0.5


def test_divergence_is_recorded_not_raised(setup):
    _, _, res = run(setup, policy="off", kl="forward", force_lr=1e30, grad_clip=None, dtype="fp32")
    assert res.collapsed and res.collapse_step is not None


def test_bad_config_values_are_named():
    with pytest.raises(ValueError, match="'sideways'"):
        cell(kl="sideways")
    with pytest.raises(ValueError, match="'maybe'"):
        cell(policy="maybe")
    with pytest.raises(ValueError, match="'fp16'"):
        cell(dtype="fp16")


# --------------------------------------------------------------------------- the paper's training details


def test_training_details_default_to_kdlab_behaviour():
    """Unset, the new parameters change nothing: sampling at ``temperature``, loss at 1, default
    AdamW, constant lr without warm-up."""
    from kdlab.engine.trainer import lr_at, make_adamw

    cfg = cell(temperature=0.8)
    assert cfg.sample_temperatures() == (0.8, 0.8) and cfg.loss_temperatures() == (1.0, 1.0)
    paper = cell(teacher_temperature=0.5, student_temperature=1.0, warmup=10, fused_adamw=True)
    assert paper.sample_temperatures() == (1.0, 0.5) and paper.loss_temperatures() == (1.0, 0.5)
    assert [lr_at(s, 1e-5, 10) for s in (0, 4, 9, 10, 149)] == pytest.approx([1e-6, 5e-6, 1e-5, 1e-5, 1e-5])
    assert lr_at(0, 1e-5, 0) == 1e-5
    p = [torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))]
    assert make_adamw(p, 1e-3, 0.0, False)[1] == "adamw"
    opt, name = make_adamw(p, 1e-3, 0.0, True)
    assert name == "adamw-fused" and opt.defaults["fused"]  # CPU supports fused AdamW in torch >= 2.4
    with pytest.raises(ValueError, match="teacher_temperature"):
        cell(teacher_temperature=0.0)
    with pytest.raises(ValueError, match="student_temperature"):
        cell(student_temperature=float("nan"))


def test_explicit_unit_temperatures_reproduce_the_default_run(setup):
    """teacher/student temperature 1 (with sampling temperature 1) is exactly kdlab's default run."""
    a = run(setup, policy="on", kl="reverse", lr=1e-3, seed=3)
    b = run(setup, policy="on", kl="reverse", lr=1e-3, seed=3, teacher_temperature=1.0, student_temperature=1.0)
    assert [h["loss"] for h in a[2].history] == [h["loss"] for h in b[2].history]


def test_teacher_temperature_enters_the_loss_and_the_sampling(setup):
    from kdlab.models.codec import CHAR
    from kdlab.engine.rollout import sample

    task, pool, teacher, offpd = setup
    _, _, res = run(setup, policy="off", kl="forward", lr=1e-3, teacher_temperature=0.5, student_temperature=1.0)
    _, _, ref = run(setup, policy="off", kl="forward", lr=1e-3)
    assert res.history[0]["loss"] != ref.history[0]["loss"]
    # the first loss is the forward KL from softmax(z_T / 0.5) to softmax(z_S) on the first batch
    assert math.isclose(res.history[0]["loss"], res.history[0]["forward_kl"], rel_tol=1e-3, abs_tol=1e-4)
    # sampling: the teacher's logits divided by teacher_temperature (OffPD, lam = -1)
    prompts = [CHAR.prompt(p.prompt) for p in pool.problems[:6]]
    x = sample(None, prompts, 12, lam=-1.0, teacher=teacher, temperature=1.0, teacher_temperature=0.5,
               generator=torch.Generator().manual_seed(0))
    y = sample(None, prompts, 12, lam=-1.0, teacher=teacher, temperature=0.5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x.tokens, y.tokens)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_paper_sampled_kl_warmup_and_fused_adamw_run(setup, direction):
    _, _, res = run(setup, policy="on", kl="sf", sampled_direction=direction, lr=1e-3, warmup=2, fused_adamw=True,
                    teacher_temperature=0.5, student_temperature=1.0)
    assert not res.collapsed and len(res.history) == 3 and res.optimizer == "adamw-fused"
    assert [h["lr"] for h in res.history] == pytest.approx([5e-4, 1e-3, 1e-3])
    assert all(math.isfinite(h["loss"]) and math.isfinite(h["grad_norm"]) for h in res.history)


def test_runs_record_the_training_details():
    from kdlab.study.runs import training_details

    d = training_details(cell(kl="sf", teacher_temperature=0.5, warmup=10, batch_size=32), "adamw-fused")
    assert d == {"teacher_sample_temperature": 0.5, "student_sample_temperature": 1.0, "teacher_loss_temperature": 0.5,
                 "student_loss_temperature": 1.0, "lr_schedule": "constant", "warmup": 10, "prompts_per_step": 32,
                 "optimizer": "adamw-fused", "sampled_estimator": "sf"}
    assert training_details(cell(), "adamw")["sampled_estimator"] is None


def test_fp32_arithmetic_on_bf16_parameters_is_one_rounded_adamw_step(setup):
    """compute_dtype fp32 with bf16 parameters (the CPU default, "auto"): one step equals, to the
    bit, an independent reference: forward and backward of an fp32 copy of the bf16 weights (the
    teacher in fp32 too), the gradients rounded to bf16, clipped, then AdamW on the bf16 weights
    themselves (no master copy). The parameters and the optimizer state stay bf16."""
    import copy

    from kdlab.engine.batching import pad_left, pad_right, response_logits
    from kdlab.models.codec import CHAR
    from kdlab.engine.cpu import _fast_cpu_attention
    from kdlab.engine.trainer import compute_dtype_of
    from kdlab.core.kl import kl_loss

    task, _, teacher, (problems, responses) = setup
    one = ([problems[0]], [responses[0]])  # a one-item OffPD pool: the batch is known
    cfg = cell(steps=1, batch_size=4, policy="off", kl="reverse", lr=1e-2, grad_clip=0.5)
    assert cfg.compute_dtype == "auto" and compute_dtype_of(cfg, torch.device("cpu")) == torch.float32
    student = build_model("llama", "nano", seed=0).to(torch.bfloat16)
    ref = copy.deepcopy(student)
    distill(student, teacher, task, cfg, offpd=one, progress=False)

    work, t32 = copy.deepcopy(ref).float().train(), copy.deepcopy(teacher).float()
    sp, spm = pad_left([CHAR.prompt(problems[0].prompt)] * 4)
    r, rm = pad_right([responses[0]] * 4)
    with _fast_cpu_attention(work, t32):  # the loop's attention implementation on CPU
        with torch.no_grad():
            t_logits = response_logits(t32, sp, spm, r, rm, CHAR.vocab_size)
        loss = kl_loss(response_logits(work, sp, spm, r, rm, CHAR.vocab_size), t_logits, "reverse", rm)
        loss.backward()
    for p, w in zip(ref.parameters(), work.parameters()):
        p.grad = w.grad.to(torch.bfloat16)
    torch.nn.utils.clip_grad_norm_(list(ref.parameters()), 0.5)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    opt.step()
    assert all(p.dtype == torch.bfloat16 for p in student.parameters())
    moved = sum(not torch.equal(p, q) for p, q in zip(student.parameters(), build_model("llama", "nano", seed=0)
                                                      .to(torch.bfloat16).parameters()))
    assert moved > 0
    for (name, p), q in zip(student.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), name


def test_bf16_and_fp32_arithmetic_agree_to_bf16_precision(setup):
    """The same run with bf16 and with fp32 arithmetic: the first step's loss (same batch, same
    weights) agrees to bf16 precision, and both train."""
    a = run(setup, policy="off", kl="forward", lr=1e-3, compute_dtype="bf16")[2].history
    b = run(setup, policy="off", kl="forward", lr=1e-3, compute_dtype="fp32")[2].history
    assert math.isclose(a[0]["loss"], b[0]["loss"], rel_tol=2e-2)
    assert a[0]["loss"] != b[0]["loss"]  # the arithmetic did differ
    with pytest.raises(ValueError, match="compute_dtype"):
        cell(compute_dtype="fp16")


def test_all_finite_finds_one_bad_value_among_many_tensors():
    """The fused max-abs check agrees with a per-tensor isfinite, for NaN, +inf and -inf."""
    from kdlab.engine.trainer import all_finite

    params = [torch.nn.Parameter(torch.randn(5, 7, dtype=torch.bfloat16) * 1e30) for _ in range(4)]
    assert all_finite(params, 1) and all_finite(params, 2)
    for bad in (float("nan"), float("inf"), -float("inf")):
        with torch.no_grad():
            params[2][3, 1] = bad
        assert not all_finite(params, 1) and not all_finite(params, 2)
        with torch.no_grad():
            params[2][3, 1] = 0.0


def test_keep_freed_heap_takes_effect_with_glibc():
    """On Linux (glibc) the allocator accepts the setting; elsewhere it is a no-op that says so."""
    import platform

    from kdlab.engine.cpu import keep_freed_heap

    took = keep_freed_heap()
    assert isinstance(took, bool)
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert took


def test_shared_offpd_teacher_logits_are_the_teachers_and_leave_the_run_unchanged(setup):
    """The whole pool's teacher logits, computed once (``offpd_teacher_logits``), equal the
    teacher's logits of each response (zero past its end), and an OffPD run that reads them
    trains as one that runs the teacher on the rows it draws (up to float rounding of the
    batch shapes), with every row served from the store."""
    from kdlab.engine.batching import pad_left, pad_right, response_logits
    from kdlab.engine.data import prompt_ids
    from kdlab.engine.offpd import offpd_teacher_logits

    task, pool, teacher, offpd = setup
    store = offpd_teacher_logits(teacher, offpd)
    problems, responses = offpd
    assert store.shape[:2] == (len(responses), max(len(r) for r in responses))
    for i in (0, 5):
        p, pm = pad_left([prompt_ids(problems[i].prompt)])
        r, rm = pad_right([responses[i]])
        with torch.no_grad():
            ref = response_logits(teacher, p, pm, r, rm)[0]
        n = len(responses[i])
        torch.testing.assert_close(store[i, :n], ref, atol=2e-2, rtol=2e-2)  # bf16 teacher, other batch shapes
        assert not store[i, n:].any()
    cfg = cell(steps=3, batch_size=4, lr=1e-3)
    plain = distill(build_model("llama", "nano", seed=0), teacher, task, cfg, offpd=offpd, progress=False)
    shared = distill(build_model("llama", "nano", seed=0), teacher, task, cfg, offpd=offpd, progress=False,
                     offpd_teacher_logits=store)
    assert [h["teacher_cached"] for h in shared.history] == [1.0, 1.0, 1.0]
    assert [h["loss"] for h in shared.history] == pytest.approx([h["loss"] for h in plain.history], rel=2e-2)
    with pytest.raises(ValueError, match="does not fit"):
        distill(build_model("llama", "nano", seed=0), teacher, task, cfg, offpd=offpd, progress=False,
                offpd_teacher_logits=store[:-1])


def test_history_records_each_kl_at_the_answer_and_contested_positions(setup):
    """Every step logs the diagnosis (kdlab.core.answer) from the one host read: on reference
    completions every row has an answer position; masses are probabilities, gradient norms
    positive, the share of contested tokens in [0, 1]."""
    import random

    from kdlab.core.answer import STATS
    from kdlab.models.codec import CHAR

    task, pool, teacher, _ = setup
    problems = [pool.problems[i] for i in range(16)]
    offpd = (problems, [CHAR.completion(task.reference(p, random.Random(i))) for i, p in enumerate(problems)])
    student = build_model("llama", "nano", seed=0)
    res = distill(student, teacher, task, cell(steps=2, batch_size=4, policy="off", kl="reverse", lr=1e-3),
                  offpd=offpd, progress=False)
    for h in res.history:
        assert h["answer_rows"] == 1.0 and 0.0 <= h["contested_share"] <= 1.0
        for where in ("answer", "contested"):
            assert {f"{where}_{k}" for k in STATS[1:]} <= set(h)
            if where == "contested" and h["contested_share"] == 0.0:  # untrained nano models may agree everywhere
                assert math.isnan(h["contested_p_student"])
                continue
            assert 0.0 < h[f"{where}_p_student"] < 1.0 and 0.0 < h[f"{where}_p_teacher"] <= 1.0
            assert h[f"{where}_grad_reverse"] > 0 and h[f"{where}_grad_forward"] > 0
            assert abs(h[f"{where}_grad_reverse_at_a"]) <= h[f"{where}_grad_reverse"] + 1e-9


@pytest.mark.parametrize("policy", ["off", "on"])
@pytest.mark.parametrize("kl", ["forward", "reverse"])
def test_teacher_hidden_states_train_as_the_teachers_logits(setup, policy, kl):
    """``teacher_hidden``: the teacher's last hidden states and head (kdlab.core.head_kl) in place
    of its logits, in the OffPD cache (d values a token, not V) and in the KL, train the student
    as the logits do: the same losses, both KLs and diagnosis in the history, and the same
    weights, up to float rounding (fp32 arithmetic on the CPU; the teacher's head applied to
    its hidden states chunk by chunk instead of inside its forward)."""
    from kdlab.engine.offpd import offpd_teacher_logits

    task, pool, teacher, offpd = setup
    runs = {}
    for hidden in (False, True):
        cfg = cell(steps=3, batch_size=4, policy=policy, kl=kl, lr=1e-3, dtype="fp32", teacher_hidden=hidden,
                   kl_chunk_size=5 if hidden else 0)
        student = build_model("llama", "nano", seed=0)
        runs[hidden] = student, distill(student, teacher, task, cfg, offpd=offpd, pool=pool, progress=False)
    (s0, r0), (s1, r1) = runs[False], runs[True]
    for key in ("loss", "forward_kl", "reverse_kl", "grad_norm", "contested_share", "contested_p_teacher"):
        assert [h[key] for h in r1.history] == pytest.approx([h[key] for h in r0.history], rel=1e-4, abs=1e-6, nan_ok=True), key
    for a, b in zip(s0.parameters(), s1.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    if policy == "off":
        assert all("teacher_cached" in h for h in r1.history)  # the pool's teacher side served by the (hidden) cache
        store = offpd_teacher_logits(teacher, offpd, hidden=True)  # (pool, longest, d): the shared store
        assert store.shape == (len(offpd[1]), max(len(r) for r in offpd[1]), teacher.config.hidden_size)


def test_teacher_hidden_states_need_a_full_vocabulary_kl():
    from kdlab.core.fields import ConfigError

    with pytest.raises(ConfigError, match="teacher_hidden: .* kl 'jsd' needs the teacher's logits"):
        cell(kl="jsd", teacher_hidden=True)


def test_lambda_mixture_reuses_its_rollouts_teacher_logits(setup, monkeypatch):
    """A lambda-mixture rollout returns the teacher's logits at every sampled step, equal to the
    teacher's response logits of the sampled tokens; a lambda run that trains on them takes the
    same steps as one that runs the teacher again (float rounding of the KV-cached decode), and
    its steps never run the teacher (only the rollout does); OnPD keeps none."""
    import kdlab.engine.distill as D
    from kdlab.engine.batching import pad_left, pad_right, response_logits
    from kdlab.engine.data import prompt_ids
    from kdlab.engine.rollout import sample

    task, pool, _, _ = setup
    teacher = build_model("llama", "nano", seed=1).eval()  # fp32: the comparison is of float rounding only
    student = build_model("llama", "nano", seed=0).eval()
    prompts = [prompt_ids(p.prompt) for p in pool.problems[:6]]
    g = torch.Generator().manual_seed(3)
    ro = sample(student, prompts, task.max_new_tokens, lam=0.5, teacher=teacher, generator=g, keep_teacher_logits=True)
    assert ro.teacher_logits is not None and ro.teacher_logits.shape[:2] == ro.tokens.shape
    p, pm = pad_left(prompts)
    with torch.no_grad():
        ref = response_logits(teacher, p, pm, ro.tokens, ro.mask)  # (B, R, V)
    m = ro.mask
    torch.testing.assert_close(ro.teacher_logits[m], ref[m][:, :ro.teacher_logits.shape[-1]], atol=1e-4, rtol=1e-4)
    assert sample(student, prompts, 8, lam=1.0, teacher=teacher, keep_teacher_logits=True).teacher_logits is None
    assert sample(student, prompts, 8, lam=0.5, teacher=teacher).teacher_logits is None

    calls = []
    real = D.response_logits
    monkeypatch.setattr(D, "response_logits", lambda model, *a, **k: (calls.append(model is teacher), real(model, *a, **k))[1])
    cfg = cell(steps=3, batch_size=4, lr=1e-3, policy="lambda", lam=0.0, kl="forward")
    reused = distill(build_model("llama", "nano", seed=0), teacher, task, cfg, pool=pool, progress=False)
    assert calls and not any(calls)  # only the student's logits were computed in the steps
    monkeypatch.setattr(D, "REUSE_ROLLOUT_TEACHER", False)
    calls.clear()
    again = distill(build_model("llama", "nano", seed=0), teacher, task, cfg, pool=pool, progress=False)
    assert any(calls)
    for key in ("loss", "forward_kl", "reverse_kl", "grad_norm"):
        assert [h[key] for h in reused.history] == pytest.approx([h[key] for h in again.history], rel=1e-4, abs=1e-6)
