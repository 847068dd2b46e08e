# vox-mqtt — the README's commands. Everything a fresh machine needs is set up here.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: test demo bench lint mosquitto install clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

mosquitto:
	@bash scripts/ensure-mosquitto.sh

test: $(STAMP) mosquitto
	$(BIN)/python -m pytest $(PYTEST_ARGS)

demo: $(STAMP) mosquitto
	$(BIN)/vox demo $(DEMO_ARGS)

bench: $(STAMP) mosquitto
	$(BIN)/python -m bench $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check vox_mqtt agent_daemon examples tests bench
	$(BIN)/ruff format --check vox_mqtt agent_daemon examples tests bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
