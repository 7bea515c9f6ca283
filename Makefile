# Rebuno — every target installs what it needs on a fresh machine.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
BIN := bin
PYTHON ?= python3
COMPAT_VENV := tests/compat/.venv
# Starts a throwaway PostgreSQL 15 cluster (installing postgresql-15 when its binaries are missing),
# runs a command with REBUNO_TEST_POSTGRES_URL pointing at it, and stops it whatever the command does.
PG_CLUSTER := tests/postgres/cluster.sh

.PHONY: all build build-test test test-go test-compat test-sdk test-ts test-upgrade test-console console-screenshots chromium firefox bench bench-long bench-peers bench-peers-smoke bench-console demo demo-go demo-ts fuzz clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/rebuno ./cmd/rebuno

# The test build adds the settings of docs/protocol/configuration.md §4 (manual clock, limiter faults).
build-test:
	$(GO) build -tags rebuno_test -ldflags "$(LDFLAGS)" -o $(BIN)/rebuno-test ./cmd/rebuno

## test: every test — Go unit, store contract on SQLite and Postgres, the black-box suite on both
## (rebuno dev, then rebuno server on Postgres), server replicas on Postgres, the published-client compatibility suite, the Python and
## TypeScript SDKs, the upgrade path from the published client to the Python SDK, and the web
## console in a real browser.
test: test-go test-compat test-sdk test-ts test-upgrade test-console

## test-go: the Go tests, inside a throwaway Postgres cluster (see PG_CLUSTER), then the black-box
## suite again with every kernel on Postgres (REBUNO_TEST_BACKEND=postgres). Under CI=true a
## Postgres test that finds no cluster fails instead of skipping.
test-go: build build-test demo demo-go $(COMPAT_VENV)/.installed
	$(GO) vet ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	REBUNO_BIN=$(CURDIR)/$(BIN)/rebuno-test $(PG_CLUSTER) run sh -c '$(GO) test -count=1 ./... && REBUNO_TEST_BACKEND=postgres $(GO) test -count=1 ./tests/blackbox/'

$(COMPAT_VENV)/.installed: tests/compat/requirements.txt
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/pip install -q --disable-pip-version-check --require-hashes -r tests/compat/requirements.txt
	touch $@

## test-compat: runs the published rebuno==0.29.2 client, unmodified, against the kernel.
test-compat: build-test $(COMPAT_VENV)/.installed
	REBUNO_BIN=$(CURDIR)/$(BIN)/rebuno-test $(COMPAT_VENV)/bin/python -m pytest -q tests/compat

SDK_PY := sdk/python
SDK_VENV := $(SDK_PY)/.venv

$(SDK_VENV)/.installed: $(SDK_PY)/pyproject.toml $(SDK_PY)/constraints.txt
	$(PYTHON) -m venv $(SDK_VENV)
	$(SDK_VENV)/bin/pip install -q --disable-pip-version-check -c $(SDK_PY)/constraints.txt -e '$(SDK_PY)[test]'
	touch $@

## test-sdk: the Python SDK: mypy --strict, unit tests, end-to-end tests against the real kernel.
test-sdk: build-test $(SDK_VENV)/.installed
	cd $(SDK_PY) && .venv/bin/mypy
	cd $(SDK_PY) && REBUNO_BIN=$(CURDIR)/$(BIN)/rebuno-test .venv/bin/python -m pytest -q

SDK_TS := sdk/typescript
EXAMPLES_TS := examples/typescript
NPM_CI := npm ci --no-audit --no-fund --loglevel=error

$(SDK_TS)/node_modules/.installed: $(SDK_TS)/package.json $(SDK_TS)/package-lock.json
	cd $(SDK_TS) && $(NPM_CI)
	touch $@

$(SDK_TS)/dist/index.js: $(SDK_TS)/node_modules/.installed $(SDK_TS)/tsconfig.json $(SDK_TS)/tsconfig.build.json $(shell find $(SDK_TS)/src -name '*.ts' 2>/dev/null)
	cd $(SDK_TS) && npm run --silent build

# The examples use the SDK as a package (a link to sdk/typescript, which must be built first).
$(EXAMPLES_TS)/node_modules/.installed: $(EXAMPLES_TS)/package.json $(EXAMPLES_TS)/package-lock.json $(SDK_TS)/dist/index.js
	cd $(EXAMPLES_TS) && $(NPM_CI)
	touch $@

## test-ts: the TypeScript SDK: tsc --strict over the SDK, its tests and the examples (the verbatim seed
## files included), then vitest: unit tests, end-to-end tests against the real kernel, the seed agent,
## checkpoints exchanged with the Python SDK, and the published tarball's contents.
test-ts: build-test $(SDK_VENV)/.installed $(EXAMPLES_TS)/node_modules/.installed demo-ts
	cd $(SDK_TS) && npx tsc -p tsconfig.json --noEmit
	cd $(EXAMPLES_TS) && npx tsc --noEmit
	cd $(SDK_TS) && REBUNO_BIN=$(CURDIR)/$(BIN)/rebuno-test REBUNO_PYTHON=$(CURDIR)/$(SDK_VENV)/bin/python npx vitest run

CONSOLE_TESTS := tests/console
# The browsers come from Debian's packages; neither Playwright nor Puppeteer downloads one here.
CHROMIUM ?= /usr/bin/chromium
FIREFOX ?= /usr/bin/firefox-esr

chromium:
	@test -x $(CHROMIUM) || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

firefox:
	@test -x $(FIREFOX) || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq firefox-esr >/dev/null)

$(CONSOLE_TESTS)/node_modules/.installed: $(CONSOLE_TESTS)/package.json $(CONSOLE_TESTS)/package-lock.json $(SDK_TS)/dist/index.js
	cd $(CONSOLE_TESTS) && $(NPM_CI)
	touch $@

## test-console: the web console (internal/console): tsc --strict over its scripts (checkJs) and the
## tests, then the browser tests against the real kernel and a TypeScript SDK agent, every scenario
## twice: in headless Chromium (playwright-core) and in headless Firefox ESR (puppeteer-core, WebDriver BiDi).
test-console: build-test chromium firefox $(CONSOLE_TESTS)/node_modules/.installed
	cd $(CONSOLE_TESTS) && npx tsc -p tsconfig.ui.json --noEmit && npx tsc -p tsconfig.json --noEmit
	cd $(CONSOLE_TESTS) && REBUNO_BIN=$(CURDIR)/$(BIN)/rebuno-test REBUNO_CHROMIUM=$(CHROMIUM) REBUNO_FIREFOX=$(FIREFOX) npx vitest run

## console-screenshots: the browser tests again, saving the pictures of docs/console.md.
console-screenshots: build-test chromium $(CONSOLE_TESTS)/node_modules/.installed
	cd $(CONSOLE_TESTS) && REBUNO_BIN=$(CURDIR)/$(BIN)/rebuno-test REBUNO_CHROMIUM=$(CHROMIUM) \
		REBUNO_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/console npx vitest run

## test-upgrade: an execution begun by an agent on the published rebuno==0.29.2 is killed and
## finished by the same agent on this project's SDK. Needs both venvs: pytest runs in the
## compatibility venv and starts each agent with its own venv's python.
test-upgrade: build-test $(COMPAT_VENV)/.installed $(SDK_VENV)/.installed
	REBUNO_BIN=$(CURDIR)/$(BIN)/rebuno-test $(COMPAT_VENV)/bin/python -m pytest -q tests/upgrade

## bench: the load generator of bench/ over real HTTP (docs/protocol/conformance.md §4), then server
## mode (PG1, PG3, PGFORK: one and three rebuno server replicas on a throwaway Postgres, unpinned),
## then the Python SDK's own cost per step (no-op @tool steps against raw signed steps, over
## loopback), then the capture overhead per step with LocalDirectory on a 1,000-file workspace, then
## the TypeScript row: the same no-op agent on both SDKs (200 executions × 10 tool steps, sequential
## and 200 at once, steps/s) and the TypeScript SDK's own cost per step, then the end-to-end
## workload per process (200 executions × 10 steps at c1 and c50: CPU per step of kernel, agent and
## client, fsyncs per step).
bench: build $(SDK_VENV)/.installed $(SDK_TS)/node_modules/.installed
	$(GO) build -o $(BIN)/rebuno-bench ./bench/cmd/rebuno-bench
	REBUNO_PERF_GUARD=1 $(BIN)/rebuno-bench -kernel $(BIN)/rebuno
	REBUNO_PERF_GUARD=1 $(BIN)/rebuno-bench -kernel $(BIN)/rebuno -only FORK,CEIL
	$(PG_CLUSTER) run sh -c '$(BIN)/rebuno-bench -kernel $(BIN)/rebuno -no-pin -postgres "$$REBUNO_TEST_POSTGRES_URL" -only PG1,PG3,PGFORK'
	$(GO) test -bench 'Evaluate200Rules' -run '^$$' ./internal/policy
	$(SDK_VENV)/bin/python $(SDK_PY)/bench/sdk_overhead.py --kernel $(CURDIR)/$(BIN)/rebuno
	$(SDK_VENV)/bin/python $(SDK_PY)/bench/capture_overhead.py --kernel $(CURDIR)/$(BIN)/rebuno
	cd $(SDK_TS) && npx tsx bench/run.ts --kernel $(CURDIR)/$(BIN)/rebuno --python $(CURDIR)/$(SDK_VENV)/bin/python
	cd $(SDK_TS) && npx tsx bench/workload.ts --kernel $(CURDIR)/$(BIN)/rebuno --fsyncs \
		--agent py=$(CURDIR)/$(SDK_VENV)/bin/python,bench/noop_agent.py --agent ts=node,--import,tsx,bench/noop-agent.ts

## bench-console: the console's numbers (docs/console.md): the first page of a 10,000-execution
## list (server time), opening a 10,000-step timeline, and live events from commit to screen.
bench-console: build chromium $(CONSOLE_TESTS)/node_modules/.installed
	rm -f $(BIN)/console-seed.db
	$(GO) run ./bench/console/seed -db $(BIN)/console-seed.db -executions 10000 -steps 10000 > $(BIN)/console-seed.json
	cd $(CONSOLE_TESTS) && REBUNO_BIN=$(CURDIR)/$(BIN)/rebuno REBUNO_CHROMIUM=$(CHROMIUM) npx tsx ../../bench/console/run.mts \
		--seed $(CURDIR)/$(BIN)/console-seed.db --info $(CURDIR)/$(BIN)/console-seed.json

bench-long: build
	$(GO) build -o $(BIN)/rebuno-bench ./bench/cmd/rebuno-bench
	REBUNO_PERF_GUARD=1 $(BIN)/rebuno-bench -kernel $(BIN)/rebuno -long

## bench-peers: Rebuno beside Restate and DBOS (bench/peers/run.py): installs the peers from npm and
## PyPI into a temporary folder, runs the same workload against every system in alternating rounds
## and prints one table (docs/performance.md, "Peers"). Needs root (a network namespace for
## restate-server, perf for fsync counts). PEERS_FLAGS=--quick for a short run.
bench-peers: build $(SDK_VENV)/.installed $(SDK_TS)/dist/index.js
	$(PYTHON) bench/peers/run.py $(PEERS_FLAGS)

## bench-peers-smoke: run.py --quick against every system, checking each was measured (on demand:
## it downloads the peers, so it is not part of `make test`).
bench-peers-smoke: build $(SDK_VENV)/.installed $(SDK_TS)/dist/index.js
	$(PYTHON) bench/peers/smoke_test.py

## demo: a kernel, the Python example agent (examples/python/demo), a crash and a replay, in under a minute.
demo: build $(SDK_VENV)/.installed
	$(GO) run ./examples/demo -kernel $(BIN)/rebuno -python $(SDK_VENV)/bin/python -script examples/python/demo/agent.py

## demo-ts: the same story with the TypeScript agent (examples/typescript/demo).
demo-ts: build $(EXAMPLES_TS)/node_modules/.installed
	$(GO) run ./examples/demo -kernel $(BIN)/rebuno -node node -script examples/typescript/demo/agent.ts

## demo-go: the same story with the raw-HTTP Go agent (examples/go-agent), no SDK.
demo-go: build
	$(GO) build -o $(BIN)/demo-agent ./examples/go-agent
	$(GO) run ./examples/demo -kernel $(BIN)/rebuno -agent $(BIN)/demo-agent

## fuzz: fuzz canonical JSON and signature verification (the seeds also run in `make test`).
fuzz:
	$(GO) test ./internal/jsonx -run '^$$' -fuzz FuzzParse -fuzztime 60s
	$(GO) test ./internal/identity -run '^$$' -fuzz FuzzArgsHash -fuzztime 60s
	$(GO) test ./internal/auth -run '^$$' -fuzz FuzzVerify -fuzztime 60s

clean:
	rm -rf $(BIN) $(COMPAT_VENV) $(SDK_TS)/node_modules $(SDK_TS)/dist $(EXAMPLES_TS)/node_modules $(CONSOLE_TESTS)/node_modules
