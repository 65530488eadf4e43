# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
RECIPE ?= recipes/tiny-cpu.yaml
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint validate plan build clean-venv

# Create the environment once; reinstall when the requirements change.
$(STAMP): requirements.txt constraints.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/trtbuild plan $(RECIPE)
	$(BIN)/trtbuild build $(RECIPE)

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check trtbuild tests bench scripts plugins

validate: $(STAMP)
	@for r in recipes/*.yaml; do $(BIN)/trtbuild validate $$r || exit 1; done

plan: $(STAMP)
	$(BIN)/trtbuild plan $(RECIPE)

build: $(STAMP)
	$(BIN)/trtbuild build $(RECIPE) --json

clean-venv:
	rm -rf $(VENV)
