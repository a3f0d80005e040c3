# The two quick-start commands (`make run`, `make test`) install what is missing, configure,
# build incrementally into $(BUILD), then run. Everything else is a convenience around them.
BUILD ?= build
TYPE  ?= RelWithDebInfo
JOBS  ?= $(shell nproc)
CMAKE_ARGS ?=
# Tests run with one job per core; the kill-loop tests start many processes each.
CTEST_ARGS ?= --output-on-failure -j $(JOBS) --timeout 600

.PHONY: all deps configure build run test bench soak asan tsan api-check forky-test forky-prepare \
  install-check \
  clean

all: build

# What install-deps.sh installs: `all` for everything (the suite, benchmarks, Python), `run` for
# `ferry run` alone (`make run`). Its stamp is newer than the configure's own when something was
# installed since the last configure, which then runs again to find it (Python, clang...). The
# configure's stamp, not the CMake cache: CMake leaves an unchanged cache as it was.
DEPS ?= all
DEPS_STAMP = $(BUILD)/.deps-installed
CONFIGURED = $(BUILD)/.configured
deps:
	@tools/install-deps.sh $(DEPS) --stamp $(DEPS_STAMP)

# ferry's own builds treat warnings as errors (FERRY_WERROR; off in a plain cmake build); a tree
# configured before the option existed gets it once. RelWithDebInfo with line tables only (-g1):
# backtraces and profiles keep their files and lines, and a source full of LibTorch's headers
# compiles as fast as without -g, where full -g costs 60% more (runtime/pool.cpp: 10.4 s of CPU
# without, 10.7 s with -g1, 16.6 s with -g). CMAKE_ARGS given here win, for full -g say.
DEBUG_FLAGS = -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
configure: deps
	@if [ ! -f $(BUILD)/CMakeCache.txt ]; then \
	  cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(TYPE) -DFERRY_WERROR=ON $(DEBUG_FLAGS) \
	    $(CMAKE_ARGS) && \
	  touch $(CONFIGURED); \
	elif ! grep -q '^FERRY_WERROR:' $(BUILD)/CMakeCache.txt || \
	     { [ -f $(DEPS_STAMP) ] && { [ ! -f $(CONFIGURED) ] || \
	       [ $(DEPS_STAMP) -nt $(CONFIGURED) ]; }; }; then \
	  cmake -S . -B $(BUILD) -DFERRY_WERROR=ON && touch $(CONFIGURED); fi

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# A first run builds what `ferry run` needs and nothing else (the suite and the benchmarks are
# most of the build: `make test` builds them).
RUN_TARGETS ?= ferry-cli ferry-worker
run:
	@$(MAKE) --no-print-directory configure DEPS=run
	cmake --build $(BUILD) -j $(JOBS) --target $(RUN_TARGETS)
	$(BUILD)/tools/ferry run

# Then the labels whose tests fork (OMP_LABELS) once more with two OpenMP threads: Debian 12's
# LibTorch takes one on two cores, pip's PyTorch takes as many as there are, and a forked child
# meets an OpenMP team its parent started only that way. Both passes run; either failing fails.
OMP_LABELS ?= runtime|pool|tools|python
test: build
	@rc=0; cd $(BUILD) && ctest $(CTEST_ARGS) || rc=$$?; \
	  if [ -n "$(OMP_LABELS)" ]; then \
	    echo "== make test: labels $(OMP_LABELS) again with OMP_NUM_THREADS=2"; \
	    OMP_NUM_THREADS=2 ctest $(CTEST_ARGS) -L '^($(OMP_LABELS))$$' || rc=$$?; \
	  fi; exit $$rc

# ferry-python-bench is generated only where the Python package is built (docs/python.md).
# The curves go to $(PLOTS); docs/benchmarks.md shows the ones drawn with PLOTS=docs/images.
PLOTS ?= $(BUILD)/plots
PLOT_PYTHON ?= /usr/bin/python3
bench: build
	$(BUILD)/test/bench/ferry-bench --json $(BUILD)/bench.json
	$(BUILD)/test/bench/ferry-fanin-bench --json $(BUILD)/fanin-bench.json
	$(BUILD)/test/bench/ferry-pool-bench --json $(BUILD)/pool-bench.json
	$(PLOT_PYTHON) -B test/bench/run_bench.py --ferry $(BUILD)/tools/ferry \
	  --json $(BUILD)/run-bench.json
	$(BUILD)/test/bench/ferry-cuda-bench --json $(BUILD)/cuda-bench.json
	if [ -x $(BUILD)/test/bench/ferry-python-bench ]; then \
	  $(BUILD)/test/bench/ferry-python-bench --json $(BUILD)/python-bench.json && \
	  $(BUILD)/test/bench/ferry-hogwild-bench --json $(BUILD)/hogwild-bench.json; fi
	if [ -x $(BUILD)/test/bench/ferry-hosts-bench ]; then \
	  $(BUILD)/test/bench/ferry-hosts-bench --json $(BUILD)/hosts-bench.json && \
	  $(PLOT_PYTHON) -B test/bench/hosts_job_bench.py --ferry $(BUILD)/tools/ferry \
	    --json $(BUILD)/hosts-job-bench.json; fi
	$(PLOT_PYTHON) -B test/bench/plot_bench.py --bench $(BUILD)/bench.json \
	  --fanin $(BUILD)/fanin-bench.json --pool $(BUILD)/pool-bench.json --out $(PLOTS)
	@echo "== make bench: every row against its limit (docs/benchmarks.md)"
	$(PLOT_PYTHON) -B test/bench/limits_check.py --missing-ok $(BUILD)/bench.json \
	  $(BUILD)/fanin-bench.json $(BUILD)/pool-bench.json $(BUILD)/run-bench.json \
	  $(BUILD)/cuda-bench.json $(BUILD)/python-bench.json $(BUILD)/hogwild-bench.json \
	  $(BUILD)/hosts-bench.json $(BUILD)/hosts-job-bench.json

# Long runs of crashes, kills and a full /dev/shm, with figures (docs/reliability.md); needs root.
# SOAK_ARGS changes the counts, e.g. SOAK_ARGS="--kills 200 --fuzz-seconds 60".
SOAK_PYTHON ?= /usr/bin/python3
SOAK_ARGS ?=
soak: build
	$(SOAK_PYTHON) -B test/soak/soak.py --build $(BUILD) --json $(BUILD)/soak.json $(SOAK_ARGS)

# The whole suite under AddressSanitizer and UndefinedBehaviorSanitizer.
asan:
	$(MAKE) test BUILD=build-asan TYPE=Asan OMP_LABELS=

# The whole suite under ThreadSanitizer. Each process writes its reports to build-tsan/tsan/
# (a child's stderr may be what a test reads); they are printed at the end, and any fails the run.
tsan:
	rm -f build-tsan/tsan/report.*
	@$(MAKE) test BUILD=build-tsan TYPE=Tsan OMP_LABELS=; rc=$$?; \
	  races=$$(grep -l 'WARNING: ThreadSanitizer' build-tsan/tsan/report.* 2>/dev/null); \
	  for f in $$races; do echo "== $$f"; cat "$$f"; done; \
	  if [ -n "$$races" ]; then echo "ThreadSanitizer reports in: $$races"; exit 1; fi; \
	  exit $$rc

# Every source (libraries, tools, workers, tests, benchmarks, CUDA) compiled with -fsyntax-only and
# the build's own warnings against a newer LibTorch's headers, Debian trixie's libtorch-dev 2.6, as
# C++17 and as C++20; with trixie's Gloo headers too, which that LibTorch's c10d expects. The package is fetched once into $(API_BUILD) (private apt state, nothing
# installed); later runs work offline and skip sources unchanged since they passed.
# API_SKIP_BUILT names build trees whose sources are left out (CI: build-forky, see .ci/run).
API_BUILD ?= build-api
API_STDS ?= c++17 c++20
API_SKIP_BUILT ?=
api-check: deps
	@tools/fetch-debian-packages.sh $(API_BUILD)/trixie trixie libtorch-dev libgloo-dev
	@cmake -S . -B $(API_BUILD) -DCMAKE_BUILD_TYPE=$(TYPE) -DFERRY_API_CHECK=ON -DFERRY_WERROR=ON \
	  $(CMAKE_ARGS) \
	  >$(API_BUILD)/configure.log 2>&1 || { cat $(API_BUILD)/configure.log; exit 1; }
	@python3 tools/api_check.py --build $(API_BUILD) --torch-include $(API_BUILD)/trixie/root/usr/include \
	  $(foreach s,$(API_STDS),--std $(s)) $(foreach b,$(API_SKIP_BUILT),--skip-built-in $(b)) \
	  -j $(JOBS)

# The suite against Debian forky's LibTorch 2.x (C++20, Catch2 3, two OpenMP threads), in a chroot
# made once in $(FORKY_ROOT), outside the checkout, and reused; the build goes to build-forky/.
# Needs root. FORKY_CTEST_ARGS chooses the tests (docs/architecture.md says which run, and why).
FORKY_ROOT ?= /var/tmp/ferry-forky
FORKY_CTEST_ARGS ?=
forky-test:
	FORKY_ROOT=$(FORKY_ROOT) JOBS=$(JOBS) CMAKE_ARGS="$(CMAKE_ARGS)" \
	  tools/forky-test.sh $(FORKY_CTEST_ARGS)

# The chroot alone, made and filled, nothing built: CI's first step, beside the Debian 12 pass.
forky-prepare:
	FORKY_ROOT=$(FORKY_ROOT) tools/forky-test.sh --prepare

clean:
	rm -rf $(BUILD) build-asan build-tsan $(API_BUILD) build-forky
