# One command per job; each sets up .venv first (CPU torch from the local wheel cache or PyPI).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test bench clean

$(BIN)/.installed: requirements.txt requirements-dev.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -r requirements.txt -r requirements-dev.txt
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/python -m sjdvp_core --prompt "a red circle on grass" --methods ar sjd sjd-vp --out out

test: setup
	$(BIN)/python -m pytest -q tests

bench: setup
	$(BIN)/python -m benchmarks.compare_methods --model demo

clean:
	rm -rf $(VENV)
