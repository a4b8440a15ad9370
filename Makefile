# Everything runs from the project's own virtual environment. Each target that needs it sets it up first, once:
# `make serve` and `make test` work on a fresh clone, and `make install` does the set-up alone.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# The optional extras `make test` and the other developer targets install (and `make install`, by default): onnx is
# ONNX Runtime (scorekit serve --runtime onnx), openvino is OpenVINO (--runtime openvino), otel OpenTelemetry's
# exporters (--otlp-traces-endpoint); EXTRAS=test,bench,onnx,openvino,otel,ray adds Ray Serve (scorekit serve --ray),
# as CI does.
EXTRAS ?= test,bench,onnx,openvino,otel
# `make serve` needs none: torch and scorekit's own dependencies serve the default model. SERVE_EXTRAS=onnx, for
# instance, adds ONNX Runtime for ARGS="--runtime onnx".
SERVE_EXTRAS ?=

# The set-up is remembered in two kinds of file inside the venv, so `rm -rf .venv` starts over and git ignores them.
# $(RECORD) holds the extras pip last installed, written only after it succeeded. A stamp, .installed-<extras>, says
# the venv had those extras after pyproject.toml last changed: make remakes it only when pyproject.toml is newer, or
# when the extras asked for change, since they are in its name. Remaking it installs only where the record is older
# than pyproject.toml or lacks one of the extras, so a venv that already has more (`make test`, then `make serve`)
# is not installed again.
RECORD := $(VENV)/.extras
comma := ,
space := $(subst ,, )
# "test,bench" -> "bench test"; sorted, so the same extras in another order name the same stamp.
words_of = $(sort $(subst $(comma), ,$(1)))
stamp_of = $(VENV)/.installed-$(or $(subst $(space),+,$(call words_of,$(1))),base)
# The extras a stamp's name stands for (the stem of the pattern rule below).
extras_of_stem = $(filter-out base,$(subst +, ,$(1)))
# Read when a recipe runs, not when make starts, so an install earlier in the same run counts.
recorded = $(shell cat $(RECORD) 2>/dev/null)
SERVE_ENV := $(call stamp_of,$(SERVE_EXTRAS))
DEV_ENV := $(call stamp_of,$(EXTRAS))

.PHONY: install serve test lint typecheck unit bench bench-smoke bench-peers mutants

# Installs every time it is asked. What the record names comes again with EXTRAS, so that after pyproject.toml
# changed, every extra the record claims is brought up to date with it (pip never takes an extra away).
install: all_extras = $(sort $(call words_of,$(EXTRAS)) $(recorded))
install:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# torch first and pinned: the CPU wheel on disk; an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install torch==2.13.0
	# torch named again, so no extra's requirement can move it off the pinned CPU wheel.
	$(PY) -m pip install -e '.$(if $(all_extras),[$(subst $(space),$(comma),$(all_extras))])' torch==2.13.0
	echo '$(all_extras)' > $(RECORD)

$(VENV)/.installed-%: pyproject.toml
	@if [ -x $(PY) ] && [ $(RECORD) -nt pyproject.toml ] && [ -z '$(filter-out $(recorded),$(call extras_of_stem,$*))' ]; \
	then echo '$(VENV) is set up, with the extras [$(recorded)]'; \
	else $(MAKE) --no-print-directory install EXTRAS='$(subst $(space),$(comma),$(call extras_of_stem,$*))'; fi
	@touch $@

serve: $(SERVE_ENV)
	$(VENV)/bin/scorekit serve $(ARGS)

lint: $(DEV_ENV)
	$(VENV)/bin/ruff check scorekit tests bench mutants
	$(VENV)/bin/ruff format --check scorekit tests bench mutants
	$(VENV)/bin/mypy

typecheck: $(DEV_ENV)
	$(VENV)/bin/mypy

# Test files run in TEST_WORKERS processes, each file's tests in one of them (module fixtures, a served model, are
# built once per file); TEST_WORKERS=0 runs the suite in this process alone.
TEST_WORKERS ?= 2
test: $(DEV_ENV) lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

unit: $(DEV_ENV)
	$(PY) -m pytest -q tests/unit

bench: $(DEV_ENV)
	$(PY) -m bench $(ARGS)

bench-smoke: $(DEV_ENV)
	$(PY) -m bench --smoke

# scorekit against Infinity on one cross-encoder (bench/peers.py); makes .venv-infinity on first use.
bench-peers: $(DEV_ENV)
	$(PY) -m bench.peers $(ARGS)

# The mutation check (docs/testing.md): every mutant in mutants/catalog.py must fail its tests.
# Slow (minutes), so not part of `make test`; ARGS="--only L01 B03" runs some, ARGS=--list lists them.
mutants: $(DEV_ENV)
	$(PY) -m mutants $(ARGS)
