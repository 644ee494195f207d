# The README's two commands: `make serve` and `make test`. Both install first (idempotent).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
CHECKED := core engine transfer replica prefill decode cluster

.PHONY: install serve test lint unit integration proto bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check \
		-c constraints.txt -e '.[dev]'
	$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

serve: install
	$(BIN)/pdserve up configs/local.yaml

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy $(CHECKED)
	$(BIN)/lint-imports

unit: install
	$(BIN)/pytest tests/unit

integration: install
	$(BIN)/pytest tests/integration

test: install lint
	$(BIN)/pytest tests

proto: install
	$(BIN)/python -m grpc_tools.protoc -Itransfer/proto/_generated=transfer/proto \
		--python_out=. --pyi_out=. transfer/proto/kv_transfer.proto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
