"""kdlab.study.distributed on a private local Ray cluster (2 CPUs, no dashboard), started in-process and
shut down at the end; plus the resume semantics of ``execute_spec`` without Ray."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kdlab.study.distributed import Outcome, RayExecutor, RunSpec, execute_spec, run_on_ray, write_json_atomic

REPO_ROOT = Path(__file__).resolve().parents[1]


# Payloads. Ray pickles functions of an importable module by reference; the workers cannot import
# this test module, so the fixture registers it to be pickled by value.

def square_or_fail(x: int) -> tuple[int, int]:
    if x == 3:
        raise ValueError(f"bad item {x}")
    return x * x, os.getpid()


def make_run(out_dir: str, value: float, writes_itself: bool = False) -> dict | None:
    """A run: fails until ``out_dir/allow`` exists when value < 0; leaves a marker when called."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "called").write_text("1")
    if value < 0 and not (out / "allow").exists():
        raise RuntimeError(f"run {out.name} diverged")
    metrics = {"value": abs(value), "pid": os.getpid()}
    if writes_itself:
        write_json_atomic(out / "metrics.json", metrics)
        return None
    return metrics


# --------------------------------------------------------------------------------------------
# Without Ray
# --------------------------------------------------------------------------------------------

def test_execute_spec_resume_semantics(tmp_path):
    done = RunSpec(str(tmp_path / "a"), make_run, {"out_dir": str(tmp_path / "a"), "value": 1.0})
    assert execute_spec(done) == {"status": "done", "metrics": {"value": 1.0, "pid": os.getpid()}}
    (tmp_path / "a" / "called").unlink()
    assert execute_spec(done)["status"] == "skipped" and not (tmp_path / "a" / "called").exists()
    bad = RunSpec(str(tmp_path / "b"), make_run, {"out_dir": str(tmp_path / "b"), "value": -2.0})
    with pytest.raises(RuntimeError, match="diverged"):
        execute_spec(bad)
    err = json.loads((tmp_path / "b" / "error.json").read_text())
    assert err["error"] == "RuntimeError: run b diverged" and "Traceback" in err["traceback"]
    assert not (tmp_path / "b" / "metrics.json").exists()
    (tmp_path / "b" / "allow").write_text("")
    assert execute_spec(bad)["metrics"]["value"] == 2.0 and not (tmp_path / "b" / "error.json").exists()
    assert execute_spec(lambda: 7) == {"status": "done", "metrics": 7}
    with pytest.raises(ValueError, match="RunSpec"):
        execute_spec(42)


def test_executor_rejects_bad_arguments():
    with pytest.raises(ValueError, match="address"):
        RayExecutor("")
    with pytest.raises(ValueError, match="num_gpus_per_task"):
        RayExecutor("local", num_gpus_per_task=-1)
    with pytest.raises(ValueError, match="max_retries"):
        RayExecutor("local", max_retries=1.5)


# --------------------------------------------------------------------------------------------
# On a local Ray cluster
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def executor():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'ray>=2.9'); kdlab.study.distributed needs it")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ex = RayExecutor("local", num_gpus_per_task=1, init_kwargs=dict(
        num_cpus=2, object_store_memory=100 * 2**20, _node_ip_address="127.0.0.1"))
    ex.start()
    try:
        yield ex
    finally:
        ex.shutdown()
        assert not ray.is_initialized()


def test_map_keeps_order_and_records_failures(executor):
    seen: list[Outcome] = []
    outcomes = executor.map(square_or_fail, range(6), on_result=seen.append)
    assert [o.index for o in outcomes] == list(range(6)) and len(seen) == 6
    assert [o.status for o in outcomes] == ["done"] * 3 + ["failed"] + ["done"] * 2
    assert [o.value[0] for o in outcomes if o.ok] == [0, 1, 4, 16, 25]
    assert outcomes[3].error.startswith("ValueError: bad item 3") and "Traceback" in outcomes[3].error
    assert all(o.value[1] != os.getpid() for o in outcomes if o.ok)  # ran in Ray worker processes


def test_cpu_cluster_asks_for_no_gpu(executor):
    import ray

    assert ray.cluster_resources().get("GPU", 0) == 0
    assert executor.requested_gpus == 1 and executor.num_gpus == 0  # else the tasks would never start


def test_run_on_ray_skips_complete_runs_and_records_failures(executor, tmp_path):
    dirs = {n: tmp_path / n for n in "abcd"}
    write_json_atomic(dirs["a"] / "metrics.json", {"value": 99})
    runs = [RunSpec(str(dirs["a"]), make_run, {"out_dir": str(dirs["a"]), "value": 1.0}),
            RunSpec(str(dirs["b"]), make_run, {"out_dir": str(dirs["b"]), "value": 2.0}),
            RunSpec(str(dirs["c"]), make_run, {"out_dir": str(dirs["c"]), "value": 3.0, "writes_itself": True}),
            RunSpec(str(dirs["d"]), make_run, {"out_dir": str(dirs["d"]), "value": -4.0})]
    first = run_on_ray("unused", runs, executor=executor)
    assert [o.status for o in first] == ["skipped", "done", "done", "failed"]
    assert first[0].value == {"value": 99} and not (dirs["a"] / "called").exists()
    for n, v in (("b", 2.0), ("c", 3.0)):
        assert json.loads((dirs[n] / "metrics.json").read_text())["value"] == v
    assert "RuntimeError: run d diverged" in first[3].error
    assert json.loads((dirs["d"] / "error.json").read_text())["error"] == "RuntimeError: run d diverged"
    assert not (dirs["d"] / "metrics.json").exists()

    for n in "abc":
        (dirs[n] / "called").unlink(missing_ok=True)
    (dirs["d"] / "allow").write_text("")
    again = run_on_ray("unused", runs, executor=executor)
    assert [o.status for o in again] == ["skipped", "skipped", "skipped", "done"]
    assert not any((dirs[n] / "called").exists() for n in "abc")
    assert again[3].value["value"] == 4.0 and not (dirs["d"] / "error.json").exists()


def test_a_paper_scale_run_as_a_ray_task(executor, tmp_path):
    """kdlab.study.fsdp_run on tiny checkpoints, one Ray task, then skipped on the second sweep."""
    pytest.importorskip("accelerate", reason="accelerate is not installed; kdlab.study.fsdp_run needs it")
    from kdlab.study.fsdp_run import run_argv
    from tiny_hf import write_real_profile

    profile = write_real_profile(tmp_path / "models", "llama")
    out = tmp_path / "run"
    kwargs = dict(argv=[str(profile), "--outputs", str(tmp_path / "outputs"), "--task", "mc", "--policy", "on",
                        "--out", str(out), "--cpu", "--threads", "1", "--set", "eval.n_test=2"])
    (first,) = run_on_ray("unused", [RunSpec(str(out), run_argv, kwargs)], executor=executor)
    assert first.status == "done", first.error
    metrics = json.loads((out / "metrics.json").read_text())
    assert first.value == metrics and metrics["steps_done"] == 2 and 0 <= metrics["accuracy"] <= 1
    (second,) = run_on_ray("unused", [RunSpec(str(out), run_argv, kwargs)], executor=executor)
    assert second.status == "skipped" and second.value == metrics


def test_a_second_driver_connects_by_address(executor, tmp_path):
    import ray

    address = ray.get_runtime_context().gcs_address
    code = ("import math, sys; from kdlab.study.distributed import RayExecutor\n"
            f"with RayExecutor({address!r}, num_gpus_per_task=1) as ex:\n"
            "    out = ex.map(math.factorial, [3, 4, 5])\n"
            "    print([o.value for o in out], ex.num_gpus)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[6, 24, 120] 0.0"
