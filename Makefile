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

export_args = --target $(TARGET) \
  $(if $(MODEL),--model $(MODEL)) $(if $(WEIGHTS),--weights $(WEIGHTS)) \
  $(if $(CALIB),--calib $(CALIB)) $(if $(PARITY_DATA),--parity-data $(PARITY_DATA)) \
  $(if $(OUT),--out $(OUT)) $(if $(INPUT_SHAPE),--input-shape $(INPUT_SHAPE)) \
  $(foreach s,$(SET),--set $(s))

.PHONY: setup export test parity demo-model bench bench-quick clean

setup:  ## create .venv and install vitexport with its dev tools (package registries only)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/vitexport targets

export:  ## make export TARGET=orin [MODEL=..] [WEIGHTS=..] [CALIB=..] [PARITY_DATA=..] [OUT=..]
	$(BIN)/vitexport export $(export_args)

test:  ## the test suite (CPU only; TensorRT tests skip without TensorRT and a GPU)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

parity:  ## regenerate the demo's committed report in parity/demo
	$(BIN)/vitexport export --target orin --out parity/demo --no-resume
	rm -f parity/demo/*.onnx parity/demo/reference.npz parity/demo/.vitexport-state.json

demo-model:  ## retrain the bundled demo ViT (deterministic) and rewrite its data splits
	$(BIN)/python scripts/make_demo.py

bench:  ## vitexport vs torch.onnx.export + quantize_static, same models and data -> bench/results.md
	$(BIN)/python -m bench.run

bench-quick:  ## a small subset of the benchmark, a few minutes
	$(BIN)/python -m bench.run --quick

clean:
	rm -rf build bench/work .pytest_cache
