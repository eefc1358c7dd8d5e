"""Toy study throughput, two kdlab versions side by side in one invocation.

    python benchmarks/bench_study.py --baseline 38a876f            # params/quick.yaml, 2 workers
    python benchmarks/bench_study.py --baseline REF --set "grid.seeds=[0]"   # a smaller sample

Runs ``kdlab study PROFILE --workers N`` twice on this machine, one version after the other:
the ``--baseline`` git ref (checked out as a temporary git worktree, its own ``src/`` and
notebooks) and this working tree. Both read the same profile file and overrides, and both start
from a fresh outputs root whose model store already holds the profile's models (built or
installed once, beforehand, by this kdlab; the baseline must name them by the same hashes, which
is checked), so neither side trains a model and both pay the same first-run costs (base
evaluation and OffPD teacher rollouts, cached per study).

Per version, from the study's ``timing.json`` and each run's ``metrics.json``: the study's wall
time, the jobs phase (wall time minus the models, grid, analysis and report notebooks), runs per
minute of the jobs phase, and the worker time summed over runs, by phase: rollouts (teacher
rollouts for OffPD included), distillation steps, evaluation (base evaluation included), the
rest of the run (loading, setup) and the notebook overhead (notebook wall time minus the run's
own). Writes ``outputs/bench/study.json`` and prints a table. Timings only: nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ("rollout", "step", "eval", "run_other", "notebook_overhead")


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def overrides(pairs: list[str]) -> dict:
    from kdlab.study.config import read_yaml

    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key] = read_yaml(value)
    return out


def model_dirs(src: Path, profile_path: Path, sets: list[str]) -> list[str]:
    """Names of the profile's model directories as the kdlab under ``src`` hashes them."""
    code = (
        "import json, sys\n"
        "try:\n"
        "    from kdlab.study.config import load_profile, read_yaml\n"
        "    from kdlab.study import teachers as T\n"
        "except ImportError:  # a kdlab from before the layer packages\n"
        "    from kdlab.config import load_profile, read_yaml\n"
        "    from kdlab import teachers as T\n"
        "p = load_profile(sys.argv[1], {k: read_yaml(v) for k, _, v in (a.partition('=') for a in sys.argv[2:])})\n"
        "jobs = [('student', p.student, p.student_pretrain, T.student_mixture(p, T.student_tasks(p)))]\n"
        "jobs += [(f'teacher-{t}', p.teacher, T.teacher_schedule(p, t), T.teacher_mixture(p, t)) for t in T.base_tasks(p)]\n"
        "store = T.ModelStore('/nonexistent', shipped_dir=None)\n"
        "print(json.dumps([store.path(r, T.model_key(r, s, pre, mix, p.trace)).name for r, s, pre, mix in jobs]))\n")
    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    out = subprocess.run([sys.executable, "-c", code, str(profile_path), *sets], check=True, capture_output=True,
                         text=True, env=env).stdout
    return json.loads(out)


def summarise(study_dir: Path, wall_s: float) -> dict:
    timing = json.loads((study_dir / "timing.json").read_text())
    inv = timing["invocations"][-1]
    notebooks = {k: float(v) for k, v in inv.get("notebooks", {}).items()}
    jobs_s = inv["wall_s"] - sum(notebooks.values())
    runs = [json.loads(p.read_text()) for p in sorted((study_dir / "runs").glob("*/metrics.json"))]
    phases = {p: 0.0 for p in PHASES}
    for m in runs:
        phases["rollout"] += m["time_rollout_s"]
        phases["step"] += m["time_step_s"]
        phases["eval"] += m["time_eval_s"]
        phases["run_other"] += m["wall_s"] - m["time_rollout_s"] - m["time_step_s"] - m["time_eval_s"]
    phases["notebook_overhead"] = inv["runs_overhead_s"] + inv["kernel_start_s"]
    by_task: dict[str, list[float]] = {}
    for m in runs:
        by_task.setdefault(m["task"], []).append(m["wall_s"])
    return {"runs": len(runs), "runs_failed": inv["runs_failed"], "command_wall_s": round(wall_s, 1),
            "study_wall_s": inv["wall_s"], "jobs_s": round(jobs_s, 1),
            "runs_per_min": round(len(runs) / (jobs_s / 60), 3) if jobs_s > 0 else None,
            "notebooks_s": notebooks, "worker_s_by_phase": {k: round(v, 1) for k, v in phases.items()},
            "run_wall_s_by_task": {t: {"mean": round(sum(v) / len(v), 1), "min": round(min(v), 1),
                                       "max": round(max(v), 1)} for t, v in sorted(by_task.items())}}


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def run_version(label: str, src: Path, profile_path: Path, sets: list[str], workers: int, models: Path,
                names: list[str], work: Path) -> dict:
    root = work / label
    (root / "models").mkdir(parents=True)
    for name in names:  # the same files (hard links where possible): nothing for either side to train
        shutil.copytree(models / name, root / "models" / name, copy_function=_link_or_copy)
    cmd = [sys.executable, "-m", "kdlab", "--outputs", str(root), "study", str(profile_path), "--workers", str(workers)]
    for s in sets:
        cmd += ["--set", s]
    print(f"[{label}] {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(src / "src")}, cwd=src)
    wall = time.perf_counter() - t0
    from kdlab.study.config import load_profile

    name = load_profile(profile_path, overrides(sets)).name
    out = summarise(root / name, wall)
    out.update(label=label, source=str(src), returncode=proc.returncode)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="git ref of the version to compare against (e.g. 38a876f)")
    ap.add_argument("--profile", default="params/quick.yaml")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="outputs/bench/study.json")
    args = ap.parse_args()

    from kdlab.study.config import load_profile
    from kdlab.study.teachers import model_paths

    profile_path = (REPO / args.profile).resolve()
    profile = load_profile(profile_path, overrides(args.sets))
    models = REPO / "outputs" / "models"
    paths = model_paths(profile, models)  # installs the shipped models (or trains what is missing)
    names = sorted(p.name for p in set(paths.values()))
    base_ref = git("rev-parse", "--short", args.baseline)
    head_ref = git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "--", "src", "notebooks") else "")
    results = []
    with tempfile.TemporaryDirectory(prefix="kdlab-bench-study-") as tmp:
        work = Path(tmp)
        tree = work / "baseline-src"
        git("worktree", "add", "--detach", str(tree), args.baseline)
        try:
            for label, src in ((f"baseline {base_ref}", tree), (f"current {head_ref}", REPO)):
                got = sorted(model_dirs(src, profile_path, args.sets))
                if got != names:
                    print(f"error: {label} names the profile's models {got}, not {names}: it would train them", file=sys.stderr)
                    return 2
                results.append(run_version(label.split()[0], src, profile_path, args.sets, args.workers, models, names, work))
                results[-1]["version"] = label
        finally:
            git("worktree", "remove", "--force", str(tree))
    base, cur = results
    report = {"profile": str(args.profile), "sets": args.sets, "workers": args.workers, "models": names,
              "versions": results,
              "speedup_runs_per_min": round(cur["runs_per_min"] / base["runs_per_min"], 3)
              if base["runs_per_min"] and cur["runs_per_min"] else None,
              "speedup_study_wall": round(base["study_wall_s"] / cur["study_wall_s"], 3)}
    out = REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\n{'version':<28} {'runs':>5} {'study s':>8} {'jobs s':>8} {'runs/min':>9}  " + "  ".join(f"{p:>17}" for p in PHASES))
    for r in results:
        print(f"{r['version']:<28} {r['runs']:>5} {r['study_wall_s']:>8.0f} {r['jobs_s']:>8.0f} {r['runs_per_min']:>9.2f}  "
              + "  ".join(f"{r['worker_s_by_phase'][p]:>17.0f}" for p in PHASES))
    print(f"runs per minute: {report['speedup_runs_per_min']}x the baseline; study wall: {report['speedup_study_wall']}x -> {out}")
    return 0 if all(r["returncode"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
