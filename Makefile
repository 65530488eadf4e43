# Two commands do all set-up on a fresh machine: `make demo` and `make test`. `make test-all` is what CI runs.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
RECIPE ?= recipes/tiny-cpu.yaml
STAMP := $(VENV)/.installed
# CI: every recipe except the shared bases (base-*.yaml name no model; their children are checked).
RECIPES ?= $(filter-out recipes/base-%,$(sort $(wildcard recipes/*.yaml)))
# One JSON report per recipe and target, for CI artifacts: $(REPORTS)/<target>/<recipe>.json.
REPORTS ?= build/reports
# `make plan` plans every recipe, or only RECIPE when it is given (command line or environment).
PLAN_RECIPES = $(if $(filter command line environment,$(origin RECIPE)),$(RECIPE),$(RECIPES))
# `make demo` shows the real SmolLM2-135M-Instruct with its shipped draft; RECIPE, when given, wins.
DEMO_RECIPE = $(if $(filter command line environment,$(origin RECIPE)),$(RECIPE),recipes/smollm2-135m-cpu.yaml)
BENCH_ARGS ?=
# The second environment: the TensorRT-LLM 1.1 container's transformers and nvidia-modelopt (CPU torch),
# for the stages that run on the GPU host (requirements-trtllm11.txt). It runs the tests marked
# `trtllm11` (quantize export, draft export, engine bundle, contract) beside the default .venv.
VENV11 := .venv-trtllm11
STAMP11 := $(VENV11)/.installed
# Only these modules are collected there (the rest import triton / pytriton, absent from that stack).
TESTS11 ?= tests/test_contract.py tests/test_trtllm11_stages.py tests/test_draft_offline.py
# `make bench` also load-tests a server with AIPerf: `local` serves the recipe's deployment for the
# run; an OpenAI base URL (http://HOST:PORT/v1, e.g. trtllm-serve on a GPU host) loads that server;
# empty skips it.
BENCH_SERVER ?= local
# AIPerf pins its own stack, so it gets its own environment.
AIPERF_VENV := .venv-aiperf
AIPERF_STAMP := $(AIPERF_VENV)/.installed

.PHONY: demo draft-smollm2 test test-all test-fast test-trtllm11 venv-trtllm11 lint typecheck validate plan build deploy bench aiperf clean-venv

ifdef SYSTEM_PYTHON
# GPU hosts: use the Python that has TensorRT-LLM and CUDA torch (e.g. the TensorRT-LLM container's),
# with trtbuild installed into it by `pip install -e .`; the .venv pins the CPU build of torch.
#   make build SYSTEM_PYTHON=1 RECIPE=recipes/llama-3.1-8b-instruct-fp8-eagle3.yaml
BIN := $(patsubst %/,%,$(dir $(shell command -v trtbuild)))
STAMP :=
else
# Create the environment once; reinstall when the requirements change.
$(STAMP): requirements.txt requirements-fixtures.txt requirements-dynamo.txt constraints.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -c constraints.txt -r requirements-fixtures.txt
	$(BIN)/python -m pip install -q --no-deps -c constraints.txt -r requirements-dynamo.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	@touch $(STAMP)
endif

# Build the recipe (cached after the first time), compare plain vs speculative decoding in process,
# then serve the deployment with a real Triton server, answer a request and print a load-test table.
demo: $(STAMP)
	$(BIN)/trtbuild plan $(DEMO_RECIPE)
	$(BIN)/trtbuild build $(DEMO_RECIPE)
	$(BIN)/trtbuild bench $(DEMO_RECIPE)
	$(BIN)/trtbuild demo $(DEMO_RECIPE)

$(AIPERF_STAMP): requirements-aiperf.txt
	@test -x $(AIPERF_VENV)/bin/python || $(PYTHON) -m venv $(AIPERF_VENV) || python3 -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/python -m pip install -q --upgrade pip
	$(AIPERF_VENV)/bin/python -m pip install -q -r requirements-aiperf.txt
	@touch $(AIPERF_STAMP)

aiperf: $(AIPERF_STAMP)

# The README's test command: the default suite and the few end-to-end runs marked `e2e` (real Triton
# serving), in the .venv alone; the slow lane (`slow`: training, real-checkpoint and long end-to-end
# runs) and the second environment are `make test-all`'s.
test: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m "not slow or e2e"

# Everything, what CI runs (.ci/run): lint and the type check, every test, then the trtllm11 environment.
test-all: $(STAMP) $(STAMP11) $(AIPERF_STAMP)
	$(MAKE) --no-print-directory lint
	$(BIN)/python -m pytest -q -ra
	$(MAKE) --no-print-directory test-trtllm11

$(STAMP11): requirements-trtllm11.txt constraints.txt pyproject.toml
	@test -x $(VENV11)/bin/python || $(PYTHON) -m venv $(VENV11) || python3 -m venv $(VENV11)
	$(VENV11)/bin/python -m pip install -q --upgrade pip
	$(VENV11)/bin/python -m pip install -q -c constraints.txt -r requirements-trtllm11.txt
	$(VENV11)/bin/python -m pip install -q --no-deps -e .
	@touch $(STAMP11)

venv-trtllm11: $(STAMP11)

test-trtllm11: $(STAMP11)
	$(VENV11)/bin/python -m pytest -q -ra -m trtllm11 -p no:cacheprovider $(TESTS11)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check trtbuild tests bench scripts plugins
	$(MAKE) --no-print-directory typecheck

# mypy with the pydantic plugin on the app and every section's config ([tool.mypy] in pyproject.toml):
# a misspelled or renamed recipe field read there fails.
typecheck: $(STAMP)
	$(BIN)/mypy

# Exit status: make exits non-zero when any recipe fails; trtbuild itself exits 2 on a bad recipe
# (one line naming file, line, field and fix) and 1 on a failed check (accuracy gate, compatibility).
validate: $(STAMP)
	@fail=0; for r in $(RECIPES); do $(BIN)/trtbuild validate $$r || fail=1; done; exit $$fail

# The plan of each recipe as a table (GPU recipes without their weights also say what would run on
# a GPU host) and as JSON in $(REPORTS)/plan/.
plan: $(STAMP)
	@mkdir -p $(REPORTS)/plan; fail=0; for r in $(PLAN_RECIPES); do \
	  out=$(REPORTS)/plan/$$(basename $$r .yaml).json; \
	  if $(BIN)/trtbuild plan $$r --json > $$out; then $(BIN)/trtbuild plan $$r; \
	  else fail=1; rm -f $$out; fi; \
	done; exit $$fail

# build / deploy / bench: RECIPE (default the tiny CPU recipe); the JSON goes to stdout and the report.
build deploy: $(STAMP)
	@mkdir -p $(REPORTS)/$@; out=$(REPORTS)/$@/$$(basename $(RECIPE) .yaml).json; \
	$(BIN)/trtbuild $@ $(RECIPE) --json > $$out; rc=$$?; cat $$out; [ -s $$out ] || rm -f $$out; exit $$rc

bench: $(STAMP) $(if $(BENCH_SERVER),$(AIPERF_STAMP))
	@mkdir -p $(REPORTS)/bench; out=$(REPORTS)/bench/$$(basename $(RECIPE) .yaml).json; \
	$(BIN)/trtbuild bench $(RECIPE) --json $(BENCH_ARGS) > $$out; rc=$$?; cat $$out; \
	[ -s $$out ] || rm -f $$out; [ $$rc = 0 ] || exit $$rc; \
	if [ -n "$(BENCH_SERVER)" ]; then \
	  mkdir -p $(REPORTS)/bench-server; out=$(REPORTS)/bench-server/$$(basename $(RECIPE) .yaml).json; \
	  $(BIN)/trtbuild bench $(RECIPE) --server $(BENCH_SERVER) --json > $$out; rc=$$?; cat $$out; \
	  [ -s $$out ] || rm -f $$out; exit $$rc; \
	fi

# Trains SmolLM2's shipped draft again from nothing (hours on 2 cores; rerun to resume after a kill at
# any phase), then ships it into drafts/ and pins its files in recipes/smollm2-135m-cpu.yaml.
draft-smollm2: $(STAMP)
	$(BIN)/trtbuild build recipes/smollm2-135m-cpu-draft.yaml --until draft
	$(BIN)/python scripts/ship_draft.py build/smollm2-135m-cpu-draft

clean-venv:
	rm -rf $(VENV) $(VENV11) $(AIPERF_VENV)
