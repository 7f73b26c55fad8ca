# The interface for humans and CI: `make demo`, `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
BENCH_WORK ?= .bench-work

SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: demo test install browser clean bench up down

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python -m xdiag.profile.build_wire  # the profile decoder compiled ahead of time (numba-free reads); needs a C compiler
	$(BIN)/python -m xdiag.profile.reader  # reads a two-event profile: without the build above, numba compiles and caches now
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

## demo: profile a bundled JAX workload on this CPU and analyse it; prints the path of summary.html
demo: $(STAMP)
	$(BIN)/xdiag demo

## test: the whole suite (captures real JAX profiles once per run; the report's browser tests need Chromium)
test: $(STAMP) browser
	$(BIN)/python -m pytest -q

## browser: Debian's Chromium, which the report's browser tests drive (Playwright's own download cannot work
## offline); installed only when missing, so a second run costs nothing
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
		echo "installing chromium (apt-get) for the report's browser tests"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium fonts-dejavu-core >/dev/null; }

## up: the local stack (Pub/Sub + Firestore emulators, Cloud Storage emulator, every function); state in .xdiag-stack/
up: $(STAMP)
	$(BIN)/xdiag up

## down: stop the local stack and everything it started
down:
	@if [ -x $(BIN)/xdiag ]; then $(BIN)/xdiag down; fi

## bench: xdiag against XProf's converters on 5 MiB to 2 GiB CPU profiles and on the real TPU v5e capture (with and
## without XProf's views, and a 2 GB host made from it), then the cloud path on the local stack, then the memory
## XProf's conversions hold against xdiag's estimate, the local tool cache and the cold start (about 40 minutes; see
## bench/README.md). The captures
## and the large profiles built from them (4.4 GiB) stay in $(BENCH_WORK) for the next run; `make clean` removes them.
bench: $(STAMP)
	$(BIN)/python bench/run_bench.py --sizes 5,20,200,2048 --repeats 3 --workdir $(BENCH_WORK)
	$(BIN)/python bench/run_bench.py --tpu --repeats 3 --workdir $(BENCH_WORK)
	$(BIN)/python bench/cloud_bench.py --size-mib 20 --repeats 3 --workdir $(BENCH_WORK)
	$(BIN)/python bench/xprof_memory.py --workdir $(BENCH_WORK)
	$(BIN)/python bench/tool_cache_bench.py --size-mib 20 --repeats 3 --workdir $(BENCH_WORK)
	$(BIN)/python bench/startup_bench.py --repeats 3 --workdir $(BENCH_WORK)

clean:
	rm -rf $(VENV) xdiag-out .pytest_cache .xdiag-stack $(BENCH_WORK)
