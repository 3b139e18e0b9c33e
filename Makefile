# idemgate developer tasks. `make help` lists them.
#
# Tool versions are pinned here and nowhere else. Each tool is built once from
# the Go module proxy into $(TOOLS_DIR)/<name>-<version>/ and reused from there.

BUF_VERSION                := v1.75.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
# PROTOC_GEN_CONNECT_GO_VERSION is connectrpc.com/connect's version in go.mod: the plugin and the
# runtime its code calls are released together.
PROTOC_GEN_CONNECT_GO_VERSION := v1.21.1
STATICCHECK_VERSION        := v0.8.2
BENCHSTAT_VERSION          := v0.0.0-20260908200009-22c9c6c9d4da
GHZ_VERSION                := v0.120.0

TOOLS_DIR ?= $(HOME)/.cache/idemgate/tools
# Exported for internal/testing/adoptertest, which serves the guide's go install lines from here when make tools built them.
export TOOLS_DIR
BUF                := $(TOOLS_DIR)/buf-$(BUF_VERSION)/buf
PROTOC_GEN_GO      := $(TOOLS_DIR)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION)/protoc-gen-go
PROTOC_GEN_GO_GRPC := $(TOOLS_DIR)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)/protoc-gen-go-grpc
PROTOC_GEN_CONNECT_GO := $(TOOLS_DIR)/protoc-gen-connect-go-$(PROTOC_GEN_CONNECT_GO_VERSION)/protoc-gen-connect-go
STATICCHECK        := $(TOOLS_DIR)/staticcheck-$(STATICCHECK_VERSION)/staticcheck
BENCHSTAT          := $(TOOLS_DIR)/benchstat-$(BENCHSTAT_VERSION)/benchstat
GHZ                := $(TOOLS_DIR)/ghz-$(GHZ_VERSION)/ghz
PLUGIN_PATH        := $(dir $(PROTOC_GEN_GO)):$(dir $(PROTOC_GEN_GO_GRPC)):$(dir $(PROTOC_GEN_CONNECT_GO)):$(PATH)

# DATABASE_URL is the PostgreSQL database `make run` serves from.
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/idemgate?sslmode=disable
# BENCH_COUNT is how many times `make bench` runs each benchmark for benchstat.
BENCH_COUNT ?= 6
# GO_TEST_FLAGS are passed to `go test` by `make test`, `make faults` and `make citus`. -vet=off:
# `make lint` runs go vet with every analyzer on every package and build tag, a superset of the
# few checks go test would run again on each test package of a cold make test. The test binaries
# carry no DWARF: -gcflags=all=-dwarf=false does not generate it (7% less CPU compiling cmd/dedupesvc
# with the race detector) and -ldflags=-w does not link it (a third less a link); stacks and race
# reports are still symbolised from the binary's own tables, only a debugger misses it.
GO_TEST_FLAGS ?= -race -count=1 -timeout=15m -vet=off -gcflags=all=-dwarf=false -ldflags=-w
# E2E_PACKAGES drive whole other programs end to end: the MCP clients of other languages against the
# bridge and the gates (internal/testing/mcptest) and the container image's build and run
# (internal/imagebuild). `make e2e` runs them with the adopter's guide, and CI runs `make e2e`;
# `make test` leaves them out, so a cold `make test` stays under 600 CPU-seconds.
E2E_PACKAGES := ./internal/testing/mcptest/ ./internal/imagebuild/
# TEST_PACKAGES are what `make test` tests: every package but E2E_PACKAGES; e.g. TEST_PACKAGES=./deploy/
# for one package.
TEST_PACKAGES ?= $$(go list ./... | grep -v -x -e '.*/internal/testing/mcptest' -e '.*/internal/imagebuild')
# BIN_DIR holds the commands `make build` links (ignored by git); `make run`, `make demo` and
# `make run-example`, `make run-mcp` run them from there instead of relinking with go run each time.
BIN_DIR ?= bin
# CMDS are the commands under cmd/ that `make build` builds.
CMDS := dedupesvc idemctl idemgate-mcp incident-replay payments-server paymentsctl
# EXAMPLE_CMDS are the example servers under examples/ that `make build` builds too, so that
# `make run-rest` and `make run-mcp-server` run what it built and fetch no module it did not.
EXAMPLE_CMDS := rest-payments mcp-server
BINS := $(addprefix $(BIN_DIR)/,$(CMDS) $(EXAMPLE_CMDS))
# GO_SOURCES are what the binaries are built from: make rebuilds them only when one changes.
GO_SOURCES := $(shell find . -path ./.git -prune -o -path ./$(BIN_DIR) -prune -o \( -name '*.go' -o -name '*.sql' \) -print) go.mod go.sum
# FIRST_BUILD is printed before anything that may compile every dependency.
FIRST_BUILD := on an empty build cache this compiles every dependency first, modernc.org/sqlite (SQLite translated to Go) above all: see docs/development.md "How long the first build takes"
# REST_FLAGS are more flags for `make run-rest` (examples/rest-payments), e.g. -charge-delay 10s.
REST_FLAGS ?=
# SEED seeds `make chaos` (the workload and the fault schedule); empty picks one from the clock,
# printed so the run can be reproduced. LONG=1 runs ten times the actions and outages. CHAOS_RUN
# selects scenarios by name, as go test -run does for subtests but each level anchored at its
# start, so a name matches only from its beginning (e.g. CHAOS_RUN=sqlite/, or
# CHAOS_RUN=postgres/http- for the HTTP gate's, postgres/connect- for the Connect gate's).
SEED ?=
LONG ?=
CHAOS_RUN ?=
# LOADTEST_DURATION is how long `make loadtest` drives each row in each round, LOADTEST_ROUNDS how
# many interleaved rounds it runs (every row once a round); the defaults take about 15 minutes (26
# rows of 10 s, 3 rounds, with a few seconds a row of set-up and checks, plus the build, the
# servers and the warm-up). LOADTEST_ROWS selects rows by a regular expression on their names
# (empty: all), e.g. LOADTEST_ROWS='after-reply|floor'. LOADTEST_STORES is postgres, or
# postgres,citus for the Citus rows too (a coordinator and two workers of the run's own); empty
# takes both when Citus is installed.
LOADTEST_DURATION ?= 10s
LOADTEST_ROUNDS ?= 3
LOADTEST_ROWS ?=
LOADTEST_STORES ?=
# BUF_BREAKING_AGAINST is what `make lint` holds the protos to with buf breaking: by default the last
# commit, so an uncommitted proto change that breaks wire or source compatibility fails lint.
BUF_BREAKING_AGAINST ?= .git\#ref=HEAD
# PROTO_RELEASED is the image of the protos as last released (v0.1.0; `make proto-release` writes it),
# which `make lint` holds them to as well: in CI, on a clone of main, HEAD already holds a committed
# change, so only the released image catches one that breaks the contract.
PROTO_RELEASED := internal/protocontract/released.json
# PROTOS_DIR is where `make protos-export` writes what a caller in another language needs.
PROTOS_DIR ?= protos
# FUZZ_TIME bounds each fuzz target's run in `make fuzz`: an execution count, not a duration, because
# Go before 1.27 can fail a clean duration-bounded run with "context deadline exceeded" when the
# deadline races a busy worker (golang/go#75804). `make fuzz FUZZ_TIME=2000000x` is the nightly-style
# long run. The seed corpora run as plain tests in `make test` without it.
FUZZ_TIME ?= 50000x
# FUZZ_TARGETS are package:target pairs; their corpora live in <package>/testdata/fuzz.
FUZZ_TARGETS := ./internal/keys:FuzzValidate ./interceptor:FuzzFingerprint ./dedupesvc:FuzzRequestValidation

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets with what they do.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: tools
tools: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) $(PROTOC_GEN_CONNECT_GO) $(STATICCHECK) $(BENCHSTAT) ## Build the pinned tools once (buf, protoc plugins, staticcheck, benchstat).

# GO_INSTALL builds a tool with internal/gobuild's flags (static, -trimpath), which every binary the
# tests build shares: the adopter's guide's test installs buf and the plugins too, and compiles
# nothing make tools compiled (internal/gobuild's test holds these lines to it).
GO_INSTALL := CGO_ENABLED=0 go install -trimpath

$(BUF):
	GOBIN=$(@D) $(GO_INSTALL) github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
$(PROTOC_GEN_GO):
	GOBIN=$(@D) $(GO_INSTALL) google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
$(PROTOC_GEN_GO_GRPC):
	GOBIN=$(@D) $(GO_INSTALL) google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
$(PROTOC_GEN_CONNECT_GO):
	GOBIN=$(@D) $(GO_INSTALL) connectrpc.com/connect/cmd/protoc-gen-connect-go@$(PROTOC_GEN_CONNECT_GO_VERSION)
$(STATICCHECK):
	GOBIN=$(@D) $(GO_INSTALL) honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
$(BENCHSTAT):
	GOBIN=$(@D) $(GO_INSTALL) golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION)
# ghz is built on first use by `make loadtest` only (it takes minutes), not by `make tools`.
$(GHZ):
	GOBIN=$(@D) $(GO_INSTALL) github.com/bojand/ghz/cmd/ghz@$(GHZ_VERSION)

.PHONY: generate
generate: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) $(PROTOC_GEN_CONNECT_GO) ## Regenerate gen/ from proto/ with buf and the local plugins.
	PATH=$(PLUGIN_PATH) $(BUF) generate

.PHONY: protos-export
# protos-export builds only internal/protoset/export (seconds), not buf: it copies proto/ but the test
# services and writes the descriptor set from the descriptors compiled into gen/ and genproto.
protos-export: ## Write the callers' protos to PROTOS_DIR: idemgate's .proto sources and a descriptor set with google/rpc.
	@mkdir -p $(PROTOS_DIR)
	go run ./internal/protoset/export -sources $(PROTOS_DIR) -o $(PROTOS_DIR)/idemgate-callers.binpb
	@echo "protos-export: $(PROTOS_DIR)/ has the .proto sources; $(PROTOS_DIR)/idemgate-callers.binpb is the FileDescriptorSet with google/rpc status and error_details"

.PHONY: lint
lint: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) $(PROTOC_GEN_CONNECT_GO) $(STATICCHECK) ## go vet, staticcheck, gofmt, buf lint, buf format, buf breaking against the last commit and the released protos (internal/protocontract), and a check that gen/ is fresh.
	go vet -tags faults,citus ./...
	$(STATICCHECK) -tags faults,citus ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(BUF) lint
	$(BUF) format -d --exit-code
	$(BUF) breaking --against '$(BUF_BREAKING_AGAINST)'
	$(BUF) breaking --against $(PROTO_RELEASED)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  PATH=$(PLUGIN_PATH) $(BUF) generate --output "$$tmp" && \
	  if ! diff -r gen "$$tmp/gen"; then echo "gen/ is stale: run make generate and commit it"; exit 1; fi

.PHONY: proto-release
proto-release: ## Freeze the protos as released (run when tagging a release): write the image make lint holds every later change to.
	$(BUF) build --exclude-source-info -o $(PROTO_RELEASED)

.PHONY: build
build: $(BINS) ## Build every command into bin/ once; later make targets reuse it until a source changes.

# VERSION is what -version prints as the commands' version: the latest v* tag git describe finds
# (v0.3.0, or v0.3.0-2-g4e37491 after it), empty for none, which prints "(devel)".
VERSION ?= $(shell git describe --tags --match 'v[0-9]*' 2>/dev/null)
# VERSION_PKG holds the variables -ldflags -X stamps: go build records no commit here when
# GOFLAGS=-buildvcs=false (or in a git worktree), so the build stamps the commit itself; what the
# build information records, as go install module@version does, wins.
VERSION_PKG := github.com/idemgate/idemgate/internal/version
VERSION_LDFLAGS = -X $(VERSION_PKG).version=$(VERSION) \
  -X $(VERSION_PKG).revision=$(shell git rev-parse HEAD 2>/dev/null) \
  -X $(VERSION_PKG).commitTime=$(shell TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null) \
  -X $(VERSION_PKG).modified=$(shell test -n "$$(git status --porcelain 2>/dev/null)" && echo true)

# One go build for every command: they share the compile, and make skips it while bin/ is newer
# than every source (so after a commit that changes no source, -version names the commit built).
$(BINS) &: $(GO_SOURCES)
	@echo 'make: building $(CMDS) $(EXAMPLE_CMDS) into $(BIN_DIR)/; $(FIRST_BUILD)'
	go build -ldflags '$(VERSION_LDFLAGS)' -o $(BIN_DIR)/ $(addprefix ./cmd/,$(CMDS)) $(addprefix ./examples/,$(EXAMPLE_CMDS))

.PHONY: image
image: ## Build the dedupesvc container image without an engine into bin/dedupesvc-image.tar, for docker load or podman load.
	@echo 'make image: builds a static dedupesvc (CGO_ENABLED=0, -trimpath); $(FIRST_BUILD)'
	go run ./internal/imagebuild -o $(BIN_DIR)/dedupesvc-image.tar

.PHONY: test
# go test -json through internal/testing/testsummary prints what plain go test does (ok and FAIL
# lines, failed tests' output), then every skipped test with its reason and what to install for
# none to skip; it exits as go test did.
test: ## Run every test (fuzz seed corpora included) with the race detector against the local PostgreSQL; list the skipped ones.
	@echo 'make test: go test -race $(TEST_PACKAGES); $(FIRST_BUILD)'
	@# Built with internal/gobuild's flags, so the standard library it compiles is the one the binaries the tests start reuse.
	CGO_ENABLED=0 go build -trimpath -o $(BIN_DIR)/testsummary ./internal/testing/testsummary
	$(BIN_DIR)/testsummary go test -json $(GO_TEST_FLAGS) $(TEST_PACKAGES)

.PHONY: faults
faults: ## Run the real-process fault tests (build tag faults): dedupesvc killed, PostgreSQL crashed and failed over, store outages.
	@echo 'make faults: builds cmd/dedupesvc and starts throwaway PostgreSQL clusters; $(FIRST_BUILD)'
	go test $(GO_TEST_FLAGS) -tags faults ./cmd/dedupesvc/ ./internal/testing/outagetest/

.PHONY: e2e
e2e: adopter ## Run the end-to-end suites make test leaves out: the adopter's guide, the MCP clients of other languages, the container image.
	@echo 'make e2e: the MCP clients (node, python3; make npm-ci) and the container image (root, unshare)'
	go test $(GO_TEST_FLAGS) $(E2E_PACKAGES)

.PHONY: adopter
adopter: ## Run docs/adopting.md end to end in a directory of its own (internal/testing/adoptertest with -adopter): a second project built from the module proxy and npm.
	@echo 'make adopter: runs the adopter'"'"'s guide as written; needs the module proxy, npm, curl and the local PostgreSQL'
	go test $(GO_TEST_FLAGS) -run '^TestAdoptingGuide$$' ./internal/testing/adoptertest/ -adopter

.PHONY: citus
citus: ## Run the store's conformance suite on a Citus coordinator and two workers (build tag citus; needs ../shared/citus/build.sh run once).
	@echo 'make citus: starts a Citus coordinator and two workers (PostgreSQL 15 with citus installed by ../shared/citus/build.sh)'
	go test $(GO_TEST_FLAGS) -tags citus -run 'Citus' ./dedupesvc/pgstore/ ./internal/dedupeapp/ ./internal/testing/citustest/

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZ_TIME (default 50000 executions; FUZZ_TIME=2000000x nightly).
	@echo "make fuzz: rebuilds every dependency with coverage instrumentation first"
	@set -e; for t in $(FUZZ_TARGETS); do \
	  echo "go test -run='^$$' -fuzz='^$${t#*:}$$' -fuzztime=$(FUZZ_TIME) $${t%%:*}"; \
	  go test -run='^$$' -fuzz="^$${t#*:}\$$" -fuzztime=$(FUZZ_TIME) $${t%%:*}; \
	done

# MODEL_CONFIGS are the model's configurations `make model` verifies (policy: spin -D flags),
# longest first so that the parallel checks end together.
MODEL_CONFIGS := REEXECUTE:-DREEXECUTE LATE_RESEND:-DLATE_RESEND FAIL_CLOSED: EARLIER_SERVICE:-DEARLIER_SERVICE
# MODEL_HOLES put each fixed hole back (hole:config); each must make SPIN find a violation.
MODEL_HOLES := HOLE_CALLER_CANCEL: HOLE_HEARTBEAT_GAP:-DREEXECUTE HOLE_OUTAGE_COUNTS: \
  HOLE_LOST_BEGIN: HOLE_EXPIRED_RENEW:-DREEXECUTE HOLE_STALE_FINISH_AFTER_RESOLVE: \
  HOLE_LATE_RESEND_STRANDS:-DLATE_RESEND HOLE_SLOW_RECONNECT:-DREEXECUTE HOLE_RESUME_NOT_ATOMIC: \
  HOLE_SWEEPER_NO_RESUME:-DREEXECUTE HOLE_RETENTION_RUNS_AGAIN: HOLE_EPOCH_REUSE:-DREEXECUTE \
  HOLE_CACHE_RETRY_TIME: HOLE_RESOLVE_COMPLETED: HOLE_FIRST_FINISH_ANSWERS:-DREEXECUTE \
  HOLE_SLOW_FOLLOWUP:
# MODEL_JOBS is how many checks run at once (each is one single-threaded pan; REEXECUTE, the
# largest, takes 1.9 GB); their lines interleave, each naming its check.
MODEL_JOBS ?= 2
# The compiler and pan flags of internal/testing/model/check.sh: exhaustive safety search with state
# compression, optimised for the configurations (the long searches), unoptimised with a smaller hash
# table for the holes (pan stops at the first violation). Never -DBITSTATE: it can miss states.
MODEL_OK_CFLAGS ?= -w -O2 -DSAFETY -DCOLLAPSE
MODEL_HOLE_CFLAGS ?= -w -O0 -DSAFETY -DCOLLAPSE
MODEL_OK_PANFLAGS ?= -m1000000 -w26
MODEL_HOLE_PANFLAGS ?= -m1000000 -w22
model_flags = $(patsubst $(1):%,%,$(filter $(1):%,$(MODEL_CONFIGS) $(MODEL_HOLES)))
MODEL_OK_TARGETS := $(addprefix model-ok-,$(foreach c,$(MODEL_CONFIGS),$(firstword $(subst :, ,$(c)))))
MODEL_HOLE_TARGETS := $(addprefix model-hole-,$(foreach h,$(MODEL_HOLES),$(firstword $(subst :, ,$(h)))))
export MODEL_OK_CFLAGS MODEL_HOLE_CFLAGS MODEL_OK_PANFLAGS MODEL_HOLE_PANFLAGS

.PHONY: model $(MODEL_OK_TARGETS) $(MODEL_HOLE_TARGETS)
model: ## Model-check the reservation protocol (internal/testing/model) with SPIN, then require each HOLE_* mutation to fail (MODEL_JOBS at once).
	@command -v spin >/dev/null 2>&1 && command -v gcc >/dev/null 2>&1 || \
	  { echo "make model needs spin and gcc: apt-get install spin gcc"; exit 1; }
	@echo "make model: $(words $(MODEL_CONFIGS)) configurations checked exhaustively, then $(words $(MODEL_HOLES)) holes that must fail, $(MODEL_JOBS) at a time; about 1½ minutes on 2 idle cores, each check printing its progress"
	@start=$$(date +%s); \
	  $(MAKE) --no-print-directory -j$(MODEL_JOBS) $(MODEL_OK_TARGETS) $(MODEL_HOLE_TARGETS) && \
	  echo "make model: all $(words $(MODEL_CONFIGS) $(MODEL_HOLES)) checks passed in $$(( $$(date +%s) - start )) s"
$(MODEL_OK_TARGETS): model-ok-%:
	@internal/testing/model/check.sh ok $* $(call model_flags,$*)
$(MODEL_HOLE_TARGETS): model-hole-%:
	@internal/testing/model/check.sh hole $* -D$* $(call model_flags,$*)

.PHONY: chaos
chaos: ## Run the chaos suite: real binaries, a throwaway PostgreSQL, seeded faults, a checker (SEED=n, LONG=1, CHAOS_RUN=re).
	@echo 'make chaos: builds dedupesvc, chaos-tool and chaos-workload; $(FIRST_BUILD)'
	go test -count=1 -v -run '^TestChaos$$/$(subst /,/^,^$(CHAOS_RUN))' -parallel 4 -timeout $(if $(LONG),180m,20m) ./internal/testing/chaos/ \
	  -chaos -chaos.seed=$(or $(SEED),0) $(if $(LONG),-chaos.long)

.PHONY: bench
bench: $(BENCHSTAT) ## Run the benchmarks BENCH_COUNT times and summarise them with benchstat.
	go test -run='^$$' -bench=. -benchmem -count=$(BENCH_COUNT) -timeout=60m ./interceptor/ | tee bench.txt
	$(BENCHSTAT) bench.txt

.PHONY: loadtest
loadtest: $(GHZ) ## End-to-end load test of the real binaries with ghz and pgbench, about 15 minutes; prints the ratio table and CPU-s per 1,000 calls per process (LOADTEST_DURATION, LOADTEST_ROUNDS, LOADTEST_ROWS, LOADTEST_STORES).
	LOADTEST_STORES='$(LOADTEST_STORES)' go run ./internal/testing/loadtest -ghz '$(GHZ)' -duration '$(LOADTEST_DURATION)' -rounds '$(LOADTEST_ROUNDS)' -rows '$(LOADTEST_ROWS)'

.PHONY: run
run: $(BIN_DIR)/dedupesvc ## Run the dedupe service on 127.0.0.1:50051 on the embedded store (no set-up; data in ~/.local/share/idemgate).
	$(BIN_DIR)/dedupesvc --database-url ""

.PHONY: run-postgres
run-postgres: $(BIN_DIR)/dedupesvc ## Run the dedupe service on 127.0.0.1:50051 against PostgreSQL at DATABASE_URL (the database it names created if missing).
	$(BIN_DIR)/dedupesvc --database-url "$(DATABASE_URL)" create-database
	$(BIN_DIR)/dedupesvc --database-url "$(DATABASE_URL)"

.PHONY: demo
demo: $(BIN_DIR)/incident-replay ## Replay the double-charge incident idemgate grew from: 300 orders through timeouts, auto-retries and re-emissions, without and with idemgate.
	$(BIN_DIR)/incident-replay

.PHONY: run-example
run-example: $(BIN_DIR)/payments-server ## Run the example payments tool server on 127.0.0.1:50052 (gRPC) and 127.0.0.1:8091 (Connect, gRPC-Web), gated by the dedupe service.
	$(BIN_DIR)/payments-server -connect-listen 127.0.0.1:8091

.PHONY: run-mcp
run-mcp: $(BIN_DIR)/idemgate-mcp ## Serve the example payments tool server (make run-example) as MCP tools, streamable HTTP on 127.0.0.1:8080/mcp.
	go run ./internal/protoset/export -o $(BIN_DIR)/payments.binpb
	$(BIN_DIR)/idemgate-mcp -target 127.0.0.1:50052 -plaintext -descriptor-set $(BIN_DIR)/payments.binpb -listen 127.0.0.1:8080

.PHONY: run-mcp-server
run-mcp-server: $(BIN_DIR)/mcp-server ## Serve the native Go MCP server gated by mcpgate (examples/mcp-server), streamable HTTP on 127.0.0.1:8081/mcp; needs make run.
	$(BIN_DIR)/mcp-server -dedupe 127.0.0.1:50051 -listen 127.0.0.1:8081

.PHONY: run-rest
run-rest: $(BIN_DIR)/rest-payments ## Serve the REST payments API gated by httpgate (examples/rest-payments) on 127.0.0.1:8090, OpenAPI at /openapi.yaml, callers alice and bob (examples/rest-payments/tokens.txt, copied to bin/ as 0600: the server refuses a token file others may read); needs make run. REST_FLAGS adds flags, e.g. REST_FLAGS='-charge-delay 10s' to see a concurrent duplicate's 409.
	install -m 600 examples/rest-payments/tokens.txt $(BIN_DIR)/rest-tokens.txt
	$(BIN_DIR)/rest-payments -dedupe 127.0.0.1:50051 -listen 127.0.0.1:8090 -caller-token-file $(BIN_DIR)/rest-tokens.txt $(REST_FLAGS)

# NPM_DIRS hold the Node packages the MCP, retry and polyglot tests run (package-lock.json committed).
NPM_DIRS := internal/testing/mcptest/node internal/testing/mcptest/inspector internal/testing/retrytest/node examples/mcp-typescript-agent examples/typescript

.PHONY: npm-ci
npm-ci: ## Install the Node packages of the MCP, retry and polyglot tests (npm ci from the committed lock files).
	@for d in $(NPM_DIRS); do echo "npm ci in $$d"; (cd $$d && npm ci --no-audit --no-fund) || exit 1; done
