# Everything runs from the project's own virtual environment, made by `make install`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# The optional extras `make install` adds: onnx is ONNX Runtime (scorekit serve --runtime onnx), openvino is
# OpenVINO (--runtime openvino); EXTRAS=test,bench,onnx,openvino,ray adds Ray Serve (scorekit serve --ray), as CI does.
EXTRAS ?= test,bench,onnx,openvino

.PHONY: install serve test lint typecheck unit bench bench-smoke bench-peers mutants

install:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# torch first and pinned: the CPU wheel on disk; an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install torch==2.13.0
	# torch named again, so no extra's requirement can move it off the pinned CPU wheel.
	$(PY) -m pip install -e '.[$(EXTRAS)]' torch==2.13.0

serve:
	$(VENV)/bin/scorekit serve $(ARGS)

lint:
	$(VENV)/bin/ruff check scorekit tests bench mutants
	$(VENV)/bin/ruff format --check scorekit tests bench mutants
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest -q

bench:
	$(PY) -m bench $(ARGS)

bench-smoke:
	$(PY) -m bench --smoke

# scorekit against Infinity on one cross-encoder (bench/peers.py); makes .venv-infinity on first use.
bench-peers:
	$(PY) -m bench.peers $(ARGS)

# The mutation check (docs/testing.md): every mutant in mutants/catalog.py must fail its tests.
# Slow (minutes), so not part of `make test`; ARGS="--only L01 B03" runs some, ARGS=--list lists them.
mutants:
	$(PY) -m mutants $(ARGS)
