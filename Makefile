# The two commands of the README:
#   make sample   set up .venv and run a sample release end to end (ONNX Runtime, CPU)
#   make test     set up .venv and run the test suite (what CI runs)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
OUT ?= out

.PHONY: setup sample test test-all lint schemas clean

$(BIN)/dossier: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]' $(if $(TORCH),'$(TORCH)',)
	touch $(BIN)/dossier

setup: $(BIN)/dossier

sample: setup
	$(BIN)/python samples/build.py
	rm -rf $(OUT)/convnet-1.dossier $(OUT)/.runs/convnet-1
	$(BIN)/dossier release samples/convnet/release.toml --out $(OUT)
	$(BIN)/dossier inspect $(OUT)/convnet-1.dossier
	$(BIN)/dossier verify $(OUT)/convnet-1.dossier
	$(BIN)/dossier explain $(OUT)/convnet-1.dossier --html $(OUT)/convnet-1.report.html

test: setup
	$(BIN)/python -m pytest -q

test-all: setup
	$(BIN)/python -m pytest -q --run-slow

lint: setup
	$(BIN)/ruff check dossier cli tests samples bench

clean:
	rm -rf $(VENV) $(OUT) dossier-runs .pytest_cache
