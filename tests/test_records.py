"""Run records (issue 35): the fields and types of metrics.json and history.json, declared once in
``kdlab.study.records``, read the same way by the study runner's completeness check and the results
table; the GPU faults the worker loop tells apart (``kdlab.study.gpu_faults``)."""
from __future__ import annotations

import json
import sys
import warnings

import pytest

from kdlab.study import results as R
from kdlab.study.gpu_faults import oom_remedy, out_of_memory, poisons_process, release_memory
from kdlab.study.records import (RUN_METRICS, columns, history_problems, metrics_problems, only_nonfinite,
                                 record_problems)

RECORD = {"run_id": "r", "task": "countdown-3", "policy": "off", "lam": -1.0, "kl": "forward", "lr": 1e-4, "seed": 0,
          "dtype": "bf16", "grad_clip": None, "accuracy": 0.5, "base_accuracy": 0.25, "forgetting": -0.01,
          "sparsity": 0.9, "collapsed": False, "wall_s": 3.0}


def test_the_results_table_columns_are_the_record_fields():
    assert R.REQUIRED_COLUMNS == columns("run") == tuple(f.name for f in RUN_METRICS)
    assert {f.name for f in RUN_METRICS if not f.required} == {"pass_at_10", "grid_lr"}  # NaN when pass_n < 10; lr when absent


def test_a_whole_record_has_no_problems_and_each_fault_is_named():
    assert metrics_problems(RECORD) == [] and metrics_problems({**RECORD, "pass_at_10": 0.7, "extra": [1]}) == []
    assert history_problems([{"step": 0, "loss": float("nan")}]) == []  # a collapse's NaN loss is a record
    assert metrics_problems({}) == [f"metrics.json: {f.name!r} is missing" for f in RUN_METRICS if f.required]
    assert metrics_problems({**RECORD, "lr": True}) == ["metrics.json: 'lr' is True, expected a number"]
    assert metrics_problems(None) == ["metrics.json holds null, not an object"]
    nan = metrics_problems({**RECORD, "accuracy": float("nan"), "forgetting": float("inf")})
    assert nan == ["metrics.json: 'accuracy' is nan, not a finite number",
                   "metrics.json: 'forgetting' is inf, not a finite number"] and only_nonfinite(nan)
    assert not only_nonfinite(nan + ["metrics.json: 'seed' is missing"]) and not only_nonfinite([])
    assert metrics_problems({"start": "base", "task": "countdown-4", "seed": 0, "steps_done": 3, "initial_accuracy": 0.1,
                             "final_accuracy": None, "collapsed": False, "wall_s": 1.0}, "rlvr") == []


def test_record_problems_reads_both_files(tmp_path):
    assert record_problems(tmp_path) == ["metrics.json is missing", "history.json is missing"]
    (tmp_path / "metrics.json").write_text(json.dumps(RECORD)[:20])
    (tmp_path / "history.json").write_text("[]")
    assert record_problems(tmp_path) == ["metrics.json is not whole JSON (JSONDecodeError)"]
    (tmp_path / "metrics.json").write_text(json.dumps(RECORD))
    assert record_problems(tmp_path) == []
    assert record_problems(tmp_path, "rlvr")[0] == "metrics.json: 'start' is missing"


def test_collect_leaves_out_an_invalid_record_and_names_it(tmp_path):
    for run_id, metrics in (("a", RECORD), ("b", {}), ("c", {**RECORD, "accuracy": "high"})):
        (tmp_path / "runs" / run_id).mkdir(parents=True)
        (tmp_path / "runs" / run_id / "metrics.json").write_text(json.dumps({**metrics, "run_id": run_id}
                                                                            if metrics else {}))
    (tmp_path / "runs" / "d").mkdir()
    (tmp_path / "runs" / "d" / "metrics.json").write_text('{"run_id": "d", "ta')  # cut short
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = R.collect(tmp_path)
    assert df["run_id"].tolist() == ["a"]
    said = sorted(str(w.message) for w in caught)
    assert len(said) == 3 and "runs/b/metrics.json left out of the results: metrics.json: 'run_id' is missing" in said[0]
    assert "'accuracy' is 'high', expected a number" in said[1] and "runs/d/metrics.json" in said[2]


# ------------------------------------------------------------------------------ GPU faults


@pytest.mark.parametrize("ename,evalue,oom,poison", [
    ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", True, False),
    ("RuntimeError", "CUDA out of memory. Tried to allocate 2.00 GiB", True, False),
    ("AcceleratorError", "CUDA error: device-side assert triggered", False, True),
    ("RuntimeError", "CUDA error: an illegal memory access was encountered", False, True),
    ("RuntimeError", "CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx", False, True),
    ("ValueError", "a task with no problems", False, False),
    ("DeadKernelError", "the kernel died while executing this cell", False, False),
])
def test_gpu_faults_are_told_apart_by_the_recorded_error(ename, evalue, oom, poison):
    error = {"ename": ename, "evalue": evalue}
    assert (out_of_memory(error), poisons_process(error)) == (oom, poison)


def test_the_oom_remedy_names_the_settings_with_the_runs_values():
    assert "pretrained.micro_batch_size (rows per forward/backward, now 0, the whole batch of 32)" in \
        oom_remedy({"micro_batch_size": 0, "kl_chunk_size": 0, "batch_size": 32})
    text = oom_remedy({"micro_batch_size": 8, "kl_chunk_size": 4096, "batch_size": 32})
    assert "now 8)" in text and "pretrained.kl_chunk_size (positions per chunk of the full-vocabulary KL, now 4096" in text


def test_release_memory_drops_the_last_error_and_its_frames():
    import gc
    import weakref

    class Tensors:
        pass

    def fail():
        tensors = Tensors()
        refs.append(weakref.ref(tensors))
        raise RuntimeError("CUDA out of memory")

    refs: list = []
    try:
        fail()
    except RuntimeError:
        sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()  # what IPython keeps
    gc.collect()
    assert refs[0]() is not None
    release_memory()
    assert refs[0]() is None and not hasattr(sys, "last_traceback")
