# The two commands of the README:
#   make sample   set up .venv (no torch) and run two sample releases end to end (ONNX Runtime,
#                 CPU): the conv net's float32 routes, then the transformer block's int8 routes
#   make test     set up .venv with torch and run the test suite (slow tests left out; tests
#                 needing chromium or docker-registry skip without them), spread over
#                 TEST_WORKERS processes (pytest-xdist; docs/testing.md)
#   make test-ray   install the ray extra into .venv and run the tests marked ray (make test
#                 leaves them out, so that it needs no Ray)
#   make lint       ruff
#   make typecheck  mypy, strict, on dossier/
# CI runs .ci/run: it installs chromium and docker-registry, then runs make typecheck, make lint,
# make test, make test-ray and mkdocs build --strict (the docs extra).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
# e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu for the CPU build from PyTorch's index
TORCH_INDEX ?=
OUT ?= out
# pytest-xdist workers for `make test` (auto: one per CPU); TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= auto
# each module runs in one worker (its module fixtures are made once), the longest modules first
# in the order tests/conftest.py gives
PYTEST_DIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: setup sample test test-all test-ray lint typecheck schemas clean

$(BIN)/dossier: pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(BIN)/dossier

# torch only for the AOTInductor tests; TORCH= leaves it out (those tests then skip). The stamp
# names the requirement, so a later `make test` with TORCH set still installs it.
TORCH_STAMP := $(VENV)/.installed-$(or $(subst =,_,$(subst $() ,_,$(TORCH))),no-torch)
$(TORCH_STAMP): $(BIN)/dossier
	$(if $(TORCH),$(BIN)/python -m pip install -q $(if $(TORCH_INDEX),--index-url '$(TORCH_INDEX)' ,)'$(TORCH)',)
	touch $(TORCH_STAMP)

setup: $(BIN)/dossier $(TORCH_STAMP)

# A signature left beside an earlier bundle (docs/signing.md's example) would not match the
# new bundle, and verify checks a signature it finds (exit 13): it is removed with the bundle.
sample: $(BIN)/dossier
	$(BIN)/python samples/build.py
	rm -rf $(OUT)/convnet-1.dossier $(OUT)/convnet-1.dossier.sig.json $(OUT)/.runs/convnet-1
	$(BIN)/dossier release samples/convnet/release.toml --out $(OUT)
	$(BIN)/dossier inspect $(OUT)/convnet-1.dossier
	$(BIN)/dossier verify $(OUT)/convnet-1.dossier
	$(BIN)/dossier explain $(OUT)/convnet-1.dossier --html $(OUT)/convnet-1.report.html
	rm -rf $(OUT)/tblock-int8-1.dossier $(OUT)/tblock-int8-1.dossier.sig.json $(OUT)/.runs/tblock-int8-1
	$(BIN)/dossier release samples/tblock/release-int8.toml --out $(OUT)
	$(BIN)/dossier verify $(OUT)/tblock-int8-1.dossier
	$(BIN)/dossier explain $(OUT)/tblock-int8-1.dossier --html $(OUT)/tblock-int8-1.report.html

test: setup
	$(BIN)/python -m pytest -q $(PYTEST_DIST) -m 'not ray'

test-all: setup $(VENV)/.installed-ray
	$(BIN)/python -m pytest -q $(PYTEST_DIST) --run-slow

$(VENV)/.installed-ray: $(BIN)/dossier
	$(BIN)/python -m pip install -q -e '.[ray]'
	touch $(VENV)/.installed-ray

# in one process: the Ray tests check what a search leaves in the temporary folder (its
# measure workers' folders), which another Ray test running beside them would also write
test-ray: setup $(VENV)/.installed-ray
	$(BIN)/python -m pytest -q -p no:xdist -m ray

lint: setup
	$(BIN)/ruff check dossier cli tests samples bench

# Settings in pyproject.toml [tool.mypy] (strict, the pydantic plugin, untyped libraries named).
typecheck: setup
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(OUT) dossier-runs .pytest_cache
