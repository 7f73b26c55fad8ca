# The interface for humans and CI: `make demo`, `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

## demo: profile a bundled JAX workload on this CPU and analyse it; prints the path of summary.html
demo: $(STAMP)
	$(BIN)/xdiag demo

## test: the whole suite (captures real JAX profiles once per run)
test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) xdiag-out .pytest_cache
