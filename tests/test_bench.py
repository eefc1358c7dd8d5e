"""The distillation benchmarks (benchmarks/bench_distill.py, bench_real.py) and the fast paths they measure.

The kdlab side runs on nano models for two steps; the TRL loss-equality check runs only when
trl is importable (``pip install -e .[bench]``), and so does the real-model benchmark's whole
path, run in-process on tiny Hugging Face checkpoints (``tiny_hf``) for one step per cell. The fast paths (teacher-logit cache for OffPD,
the static-cache rollout stepper, eager attention during training) are checked against the
plain transformers computation they replace.
"""
import importlib.util
import json
import math
import random
from pathlib import Path

import pytest
import torch

from kdlab.engine import rollout
from kdlab.engine.batching import pad_left, pad_right, response_logits
from kdlab.engine.data import prompt_ids
from cells import cell
from kdlab.engine.offpd import _OffPDTeacherLogits
from kdlab.engine.distill import distill
from kdlab.models.toy import build_model

REPO_ROOT = Path(__file__).resolve().parents[1]


def _load_bench(name: str = "bench_distill"):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench = _load_bench()
needs_trl = pytest.mark.skipif(not bench.trl_available(),
                               reason="trl's GKDTrainer is not importable (pip install -e .[bench]); "
                                      "the loss check needs it")


@pytest.fixture(scope="module")
def data():
    teacher, _ = bench.build_models("nano", "nano")
    return bench.make_data(teacher, 12, new_tokens=8, pool_size=32)


# ---------------------------------------------------------------------------------------------
# the benchmark's own arithmetic
# ---------------------------------------------------------------------------------------------


def test_cached_share_matches_exact_sum_and_study_pool_is_its_own_match():
    n, k0, k1 = 100, 64, 320
    exact = sum(1 - (1 - 1 / n) ** k for k in range(k0, k1)) / (k1 - k0)  # P(item of draw k seen before)
    assert bench.cached_share(n, k0, k1) == pytest.approx(exact, abs=5e-3)
    # a study run (150 steps x 32 from 2,048) is matched by the study pool itself
    assert abs(bench.matched_pool_size(150, 32) - 2048) <= 1
    assert bench.cached_share(bench.matched_pool_size(12, 32), 0, 12 * 32) == pytest.approx(0.614, abs=0.01)
    with pytest.raises(ValueError, match="last_draw"):
        bench.cached_share(10, 5, 5)


def test_windows_are_medians_of_window_throughputs():
    wall = [1.0, 1.0, 2.0, 2.0, 0.5, 0.5]
    tokens = [10.0] * 6
    out = bench._windows(wall, [x * 2 for x in wall], tokens, window=2, repeats=3)
    assert out["window_tokens_per_s"] == [10.0, 5.0, 20.0]
    assert out["tokens_per_s"] == 10.0 and out["steps_per_s"] == 1.0
    assert out["tokens_per_cpu_s"] == 5.0


# ---------------------------------------------------------------------------------------------
# kdlab side of the benchmark (no TRL needed)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["off", "on"])
def test_kdlab_side_runs_two_steps(data, policy):
    out = bench.run_kdlab(policy, "forward", data, warmup=1, window=1, repeats=1, teacher_size="nano",
                          student_size="nano", batch=4)
    assert out["tokens_per_s"] > 0 and out["steps_per_s"] > 0 and out["tokens_per_cpu_s"] > 0
    assert len(out["step_wall_s"]) == 1 and math.isfinite(out["peak_mb"])
    assert all(math.isfinite(x) and x >= 0 for x in out["loss"])
    if policy == "off":
        assert 0.0 <= out["teacher_cache_hit"] <= 1.0
    else:
        assert "teacher_cache_hit" not in out


def test_peak_rss_sees_a_fresh_allocation():
    mem = bench.PeakRSS()
    mem.start()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    assert block.sum() > 0
    assert 56 <= mem.peak_mb() <= 200


def test_kl_memory_worker_values_agree_between_naive_and_chunked(tmp_path):
    naive = bench.kl_memory_worker("naive", 48, 300, 0, str(tmp_path / "n.pt"))
    chunked = bench.kl_memory_worker("chunked", 48, 300, 16, str(tmp_path / "c.pt"))
    a, b = torch.load(tmp_path / "n.pt"), torch.load(tmp_path / "c.pt")
    assert torch.allclose(a["values"], b["values"], atol=1e-5)
    assert torch.allclose(a["grad"], b["grad"], atol=1e-6)
    assert naive["kind"] == "naive" and chunked["chunk_size"] == 16
    with pytest.raises(ValueError, match="'wide'"):
        bench.kl_memory_worker("wide", 8, 10, 4, str(tmp_path / "x.pt"))


@needs_trl
@pytest.mark.parametrize("kl", ["forward", "reverse"])
def test_trl_and_kdlab_losses_agree_on_one_batch(data, kl):
    res = bench.loss_abs_diff(kl, data, teacher_size="nano", student_size="nano", batch=6)
    assert res["kdlab_loss"] > 0
    assert res["loss_abs_diff"] <= 1e-4


@needs_trl
def test_trl_beta_convention_on_sharp_logits():
    """beta=0 is forward KL(T||S), beta=1 reverse KL(S||T), token-mean over labels != -100; on
    sharp logits the two directions differ a lot, so a swapped mapping cannot pass."""
    from kdlab.core.kl import kl_loss

    _, gkd = bench.trl_gkd()
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(3, 5, 11, generator=g) * 3, torch.randn(3, 5, 11, generator=g) * 3
    tokens = torch.randint(0, 11, (3, 5), generator=g)
    mask = torch.rand(3, 5, generator=g) > 0.3
    labels = torch.where(mask, tokens, torch.full_like(tokens, -100))
    ours = {kl: float(kl_loss(s, t, kl, mask)) for kl in ("forward", "reverse")}
    assert abs(ours["forward"] - ours["reverse"]) > 0.1
    for kl, beta in bench.TRL_BETA.items():
        assert float(gkd.generalized_jsd_loss(s, t, labels=labels, beta=beta)) == pytest.approx(ours[kl], abs=1e-5)


# ---------------------------------------------------------------------------------------------
# the fast paths against the plain transformers computation
# ---------------------------------------------------------------------------------------------


def test_offpd_teacher_cache_equals_fresh_teacher_logits(data):
    teacher = build_model("llama", "nano", seed=1).eval()  # fp32: differences are rounding only
    problems, responses = data["problems"], data["responses"]
    cache = _OffPDTeacherLogits(teacher, problems, responses, [prompt_ids(p.prompt) for p in problems])
    for idx, want_hits in (([0, 3, 5, 3], 1), ([3, 5, 7, 0], 3)):
        r, rm = pad_right([responses[i] for i in idx])
        got, hits = cache.batch(idx, r.shape[1])
        p, pm = pad_left([prompt_ids(problems[i].prompt) for i in idx])
        with torch.no_grad():
            ref = response_logits(teacher, p, pm, r, rm)
        assert hits == want_hits
        assert torch.allclose(got[rm], ref[rm], atol=1e-4)
        assert (got[~rm] == 0).all()


def test_training_attention_is_switched_back_after_distill(data):
    teacher = build_model("llama", "nano", seed=1).to(torch.bfloat16).eval()
    student = build_model("llama", "nano", seed=0)
    task = bench.bench_task(8)
    res = distill(student, teacher, task, cell(policy="off", steps=2, batch_size=4),
                  offpd=(data["problems"], data["responses"]), progress=False)
    assert len(res.history) == 2 and all(h["time_s"] > 0 and h["cpu_s"] >= 0 for h in res.history)
    assert student.config._attn_implementation == "sdpa" and teacher.config._attn_implementation == "sdpa"


def _sizes(heads: int, kv: int) -> dict:
    return dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv,
                intermediate_size=96)


@pytest.mark.parametrize("family,heads,kv", [("llama", 2, 2), ("llama", 4, 2), ("qwen2", 4, 1)])
def test_static_stepper_matches_transformers_stepper(family, heads, kv):
    """Teacher-forced: the same tokens fed to both steppers give the same next-token logits
    (fp32; covers grouped-query attention and Qwen2's projection biases)."""
    model = build_model(family, _sizes(heads, kv), seed=3).eval()
    prompts = [prompt_ids("c12 34 56>78:"), prompt_ids("a1+2:"), prompt_ids("vhouse:")]
    rng = random.Random(0)
    feed = [torch.tensor([rng.randrange(3, 98) for _ in prompts]) for _ in range(6)]
    assert rollout._fast_decoding_supported(model)
    with torch.no_grad():
        fast, ref = rollout._StaticStepper(model, prompts, len(feed)), rollout._Stepper(model, prompts)
        for tok in [None] + feed:
            if tok is not None:
                fast.feed(tok)
                ref.feed(tok)
            assert torch.allclose(fast.last, ref.last, atol=1e-4), (fast.last - ref.last).abs().max()


def test_fast_and_transformers_rollouts_agree_and_unsupported_models_fall_back(monkeypatch):
    model = build_model("llama", _sizes(4, 2), seed=4).eval()
    prompts = [prompt_ids(p) for p in ("c12 34 56>78:", "a1+2:", "m347,291:")]
    fast = rollout.sample(model, prompts, 10, greedy=True)
    monkeypatch.setattr(rollout, "_fast_decoding_supported", lambda m: False)
    plain = rollout.sample(model, prompts, 10, greedy=True)
    assert torch.equal(fast.tokens, plain.tokens) and torch.equal(fast.mask, plain.mask)
    assert not rollout._fast_decoding_supported(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------------------------------------
# the real-model benchmark (benchmarks/bench_real.py) on tiny Hugging Face checkpoints
# ---------------------------------------------------------------------------------------------


real = _load_bench("bench_real")


def test_flop_count_of_a_smollm2_shaped_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=9,
                      num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    shape = real.model_shape(model)
    per_layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536  # q, o; k, v; gate, up, down
    assert shape["body"] == 2 * per_layer and shape["head"] == 576 * 49152 and shape["attn"] == 2 * 576
    assert sorted(map(tuple, shape["linears"][:-1])) == [(576, 192, 4), (576, 576, 4), (576, 1536, 4), (1536, 576, 2)]
    assert shape["linears"][-1] == [576, 49152, 1]
    f = real.forward_flops(shape, 8, 100)
    assert f == 2 * 8 * 100 * (shape["body"] + shape["head"]) + 4 * 8 * 100 * 100 * shape["attn"]
    # decoding: the prompt pass with the head at one position, then one position per new token
    assert real.rollout_flops(shape, 8, 10, 1) == real.forward_flops(shape, 8, 10, head_positions=1)
    assert real.rollout_flops(shape, 8, 10, 3) == pytest.approx(
        real.forward_flops(shape, 8, 10, head_positions=1) + sum(
            2 * 8 * (shape["body"] + shape["head"]) + 4 * 8 * c * shape["attn"] for c in (11, 12)))


def test_matmul_rate_reports_every_shape():
    res = real.matmul_rate([[16, 32, 3], [32, 16, 1]], rows=24)
    assert len(res["shapes"]) == 2 and res["gflops"] > 0 and res["best_gflops"] >= min(
        min(s["gflops"].values()) for s in res["shapes"])
    assert set(res["shapes"][0]["gflops"]) == {"forward", "grad_input", "grad_weight"}


@pytest.fixture(scope="module")
def tiny_real_pair(tmp_path_factory):
    """Two tiny Qwen2 checkpoints (chat template, pad token) sharing one tokenizer and vocabulary."""
    from tiny_hf import build_checkpoint, build_tokenizer

    root = tmp_path_factory.mktemp("bench-real")
    tok = build_tokenizer("qwen2")
    teacher = build_checkpoint(root / "teacher", "qwen2", "student", tok, seed=1)
    student = build_checkpoint(root / "student", "qwen2", "student", tok, seed=2)
    return student, teacher


def test_phase_clock_times_kdlab_phases_and_restores_what_it_patched(tiny_real_pair, tmp_path):
    import kdlab.engine.distill as kd

    student, teacher, codec = real.load_models(*tiny_real_pair)
    data, _, _ = real.make_real_data(*tiny_real_pair, n_pool=3, batch=2, new_tokens=4, kls=set(), with_trl=False,
                                     pool_size=16)
    backward, sample = torch.Tensor.backward, kd.sample
    clock = real.PhaseClock(student, teacher)
    out = bench.time_kdlab(student, teacher, real.real_task(4), "on", "forward", data, 0, 1, 2, 2, codec=codec,
                           clock=clock)
    assert torch.Tensor.backward is backward and kd.sample is sample
    split = clock.split(out["step_wall_s"], rate_gflops=1.0, rate_gflops_per_cpu_s=1.0)
    for phase in ("rollout", "teacher", "student_forward", "backward", "optimizer"):
        assert split[f"{phase}_s"] > 0, phase
    assert split["student_fb_s"] == pytest.approx(split["student_forward_s"] + split["backward_s"])
    assert set(split["peak_fraction"]) == {"rollout", "teacher", "student_fb"}
    assert all(v > 0 for v in split["peak_fraction"].values())
    assert set(split["peak_fraction_cpu"]) == {"rollout", "teacher", "student_fb"}
    assert all(v > 0 for v in split["peak_fraction_cpu"].values())


@needs_trl
def test_real_benchmark_one_step_per_cell_on_tiny_checkpoints(tiny_real_pair, tmp_path):
    """The whole real-model path (OffPD pool, loss check, matmul rate, both frameworks on all four
    cells with the phase clock, one profiled kdlab step), in-process, one timed step per cell."""
    student, teacher = tiny_real_pair
    out = tmp_path / "real.json"
    real.run_real(student, teacher, {"warmup": 0, "window": 1, "repeats": 1}, out, batch=2, new_tokens=4,
                  threads=1, isolate=False, profile="kdlab", log=lambda *a: None)
    cells = json.loads(out.read_text())
    assert [(c["policy"], c["kl"]) for c in cells] == list(real.CELLS)
    for c in cells:
        for key in ("kdlab_tokens_per_s", "trl_tokens_per_s", "ratio", "kdlab_tokens_per_cpu_s", "trl_tokens_per_cpu_s",
                    "kdlab_peak_mb", "trl_peak_mb", "peak_fraction", "trl_peak_fraction"):
            assert math.isfinite(c[key]) and (c[key] > 0 or key.endswith("peak_mb")), key
        assert c["loss_abs_diff"] <= 1e-4 and c["loss_within_tolerance"] and c["kdlab_loss"] > 0
        assert c["target_ratio"] == {"off": 2.0, "on": 3.0}[c["policy"]] and c["peak_target"] == 0.30
        for fw in ("kdlab", "trl"):
            split = c[f"{fw}_split"]
            assert split["student_fb_s"] > 0 and split["optimizer_s"] > 0 and split["step_s"] > 0
            assert (split["rollout_s"] > 0) == (c["policy"] == "on"), (fw, c["policy"])
        assert c["complete"] and c["peak_fraction_cpu"] > 0 and c["trl_profile"] is None
        first_of_policy = c is next(x for x in cells if x["policy"] == c["policy"])
        assert bool(c["kdlab_profile"] and c["kdlab_profile"]["ops"]) == first_of_policy
        assert c["machine"]["matmul_gflops"] > 0 and c["machine"]["matmul_gflops_per_cpu_s"] > 0
        # kdlab computes in fp32 on a CPU (distill.compute_dtype auto), TRL in bf16: each against its own rate
        assert c["machine"]["kdlab_compute_dtype"] == c["setup"]["kdlab_compute_dtype"] == "fp32"
        assert c["machine"]["kdlab_matmul_gflops"] > 0 and c["setup"]["trl_compute_dtype"] == "bf16"
        assert c["setup"]["teacher_is_student"] is False
    rates = json.loads((tmp_path / "real_matmul.json").read_text())
    assert set(rates) == {"bf16", "fp32"} and all(r["shapes"] for r in rates.values())
    assert rates["fp32"]["dtype"] == "torch.float32"
    # a spent time budget stops before the next worker; what ran is kept
    short = real.run_real(student, teacher, {"warmup": 0, "window": 1, "repeats": 1}, tmp_path / "short.json",
                          cells=(("off", "forward"),), batch=2, new_tokens=4, threads=1, isolate=False,
                          profile="none", budget_s=0.0, log=lambda *a: None)
    assert short == [] and not (tmp_path / "short.json").exists()


# ---------------------------------------------------------------- the toy study's throughput

def test_bench_study_summarises_a_study_by_phase(tmp_path):
    """benchmarks/bench_study.py reads a study's timing.json and its runs' metrics.json: the jobs
    phase is the wall time minus the notebooks, runs per minute are over the jobs phase, and the
    worker time splits into rollouts, steps, evaluation, the rest of each run and the notebook
    overhead."""
    study = _load_bench("bench_study")
    d = tmp_path / "quick"
    inv = {"wall_s": 400.0, "runs_done": 2, "runs_failed": 0, "runs_overhead_s": 6.0, "kernel_start_s": 4.0,
           "notebooks": {"teachers_s": 20.0, "grid_s": 1.0, "70_statistics_s": 9.0, "report_s": 10.0}}
    (d / "runs").mkdir(parents=True)
    (d / "timing.json").write_text(json.dumps({"invocations": [{"wall_s": 1.0, "notebooks": {}}, inv], "runs": {}}))
    for i, (task, wall, ro, st, ev) in enumerate([("countdown-3", 100.0, 20.0, 60.0, 10.0),
                                                  ("kb-mc", 50.0, 5.0, 30.0, 5.0)]):
        (d / "runs" / f"r{i}").mkdir()
        (d / "runs" / f"r{i}" / "metrics.json").write_text(json.dumps(
            {"task": task, "wall_s": wall, "time_rollout_s": ro, "time_step_s": st, "time_eval_s": ev}))
    out = study.summarise(d, 410.0)
    assert out["runs"] == 2 and out["jobs_s"] == 360.0  # the last invocation: 400 - (20 + 1 + 9 + 10)
    assert out["runs_per_min"] == pytest.approx(2 / 6.0, abs=1e-3)
    assert out["worker_s_by_phase"] == {"rollout": 25.0, "step": 90.0, "eval": 15.0, "run_other": 20.0,
                                        "notebook_overhead": 10.0}
    assert out["run_wall_s_by_task"]["kb-mc"] == {"mean": 50.0, "min": 50.0, "max": 50.0}


def test_the_head_kl_benchmark_runs_both_paths_and_compares_them(tmp_path):
    """benchmarks/bench_head_kl.py end to end on a few tokens: both paths in subprocesses, equal
    values and gradients, the JSON written; bad sizes refused with exit 2."""
    import subprocess
    import sys

    out = tmp_path / "head_kl.json"
    script = str(REPO_ROOT / "benchmarks" / "bench_head_kl.py")
    done = subprocess.run([sys.executable, script, "--tokens", "8", "--chunk-size", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["vocab"], r["direction"]) for r in rows} == {(v, k) for v in (49_152, 128_256) for k in ("forward", "reverse")}
    assert all(r["within_tolerance"] and r["logits_peak_mb"] >= 0 for r in rows)
    bad = subprocess.run([sys.executable, script, "--tokens", "0", "--out", str(tmp_path / "x.json")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--tokens" in bad.stderr and not (tmp_path / "x.json").exists()
