# One command per job; each sets up what it needs first.
#   make demo   the built-in demo model: AR vs SJD vs SJD-VP images and the speed-up report
#   make test   the test suite, including a real ComfyUI server (a second venv, .venv-comfy) and a real
#               browser on it (Chromium from apt, Playwright from pip), and the linter
#   make test-fast  the engine, models, nodes (in-process) and lint: no ComfyUI server, no browser, no
#               many-sample law tests (pytest markers comfyui, browser, statistical)
#   make test-frontends  the browser tests in each of seven ComfyUI frontends (make test drives three)
PY ?= python3
BIN := .venv/bin
COMFY := .venv-comfy/bin

.PHONY: setup setup-comfy setup-browser demo test test-fast test-frontends lint bench workflows clean

$(BIN)/.installed: requirements.txt requirements-dev.txt
	$(PY) -m venv .venv
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -r requirements.txt -r requirements-dev.txt
	touch $@

# ComfyUI itself needs torchvision, so its server runs from its own venv
$(COMFY)/.installed: requirements.txt requirements-comfyui.txt
	$(PY) -m venv .venv-comfy
	$(COMFY)/pip install -q --upgrade pip
	$(COMFY)/pip install -q "torch==2.14.1" "torchvision==0.29.1"
	$(COMFY)/pip install -q -r requirements-comfyui.txt -r requirements.txt
	touch $@

setup: $(BIN)/.installed

setup-comfy: $(COMFY)/.installed

# The browser tests (tests/comfyui/test_browser.py): Chromium from the distribution's packages (Playwright comes
# from requirements-dev.txt and drives this binary; no browser download). Needs root for apt; without
# it the tests skip and say what to install (under CI=true they fail instead).
setup-browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "browser tests: no Chromium and not root; install it (sudo apt-get install chromium) to run them"; fi

demo: setup
	$(BIN)/python -m sjdvp_core --prompt "a red circle on grass" --methods ar sjd sjd-vp --out out

test: setup setup-comfy setup-browser lint
	$(BIN)/python -m pytest -q tests

test-fast: setup lint
	$(BIN)/python -m pytest -q -m "not comfyui and not browser and not statistical" tests

# the browser tests in every frontend of the matrix (tests/comfy/browser.py's MATRIX; make test drives three)
test-frontends: setup setup-comfy setup-browser
	SJDVP_FRONTENDS=$${SJDVP_FRONTENDS:-all} $(BIN)/python -m pytest -q tests/comfyui/test_browser.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: setup
	$(BIN)/python -m benchmarks.compare_methods --model demo --repeats 3 --inits random --out benchmarks/results/demo
	$(BIN)/python -m benchmarks.sweep_vp --prompts 12 --out benchmarks/results/vp_sweep
	$(BIN)/python -m benchmarks.quality --out benchmarks/results/quality

workflows: setup
	$(BIN)/python tools/make_workflows.py

clean:
	rm -rf .venv .venv-comfy .cache
