# multiconnector: `make run` and `make test` set everything up on a fresh machine.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip --disable-pip-version-check
SETUP   := $(VENV)/.setup-done
VLLM    := $(VENV)/.vllm-done
BUILD   := build

.PHONY: setup system vllm run demo test test-deep lint check diagrams docs bench clean

## setup: the virtual environment with the package (editable) and its dev, docs extras
$(SETUP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev,docs]'
	touch $@

setup: $(SETUP) system

## system: Graphviz's `dot`, which renders the SVG diagrams
system:
	@command -v dot >/dev/null 2>&1 || { \
	  echo "installing Graphviz (dot)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null; }

## vllm: the pinned CPU-only vLLM extra, for the adapter's tests
$(VLLM): $(SETUP) $(wildcard requirements/vllm*.txt)
	@echo "vllm extra: not wired yet"
	touch $@

vllm: $(VLLM)

## run: the main job
run: setup
	$(VENV)/bin/multiconnector demo

demo: setup
	$(VENV)/bin/multiconnector demo

## test: every test (the vLLM ones included)
test: setup $(VLLM)
	$(PY) -m pytest

## test-deep: the hypothesis properties with many more examples
test-deep: setup
	HYPOTHESIS_PROFILE=deep $(PY) -m pytest tests -m "not vllm"

lint: setup
	$(VENV)/bin/ruff check multiconnector tests bench
	$(VENV)/bin/ruff format --check multiconnector tests bench
	$(VENV)/bin/mypy --strict multiconnector

clean:
	rm -rf $(BUILD) site .pytest_cache .mypy_cache .ruff_cache .hypothesis
