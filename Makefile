# Two entry points: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test venv bench clean workbench browser

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# the demo needs the core only; the tests also need the test extras and torch (CPU build)
$(VENV)/.installed-core: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q -e '.[test,torch]'
	touch $@ $(VENV)/.installed-core

venv: $(VENV)/.installed

demo: $(VENV)/.installed-core
	$(BIN)/perfcast estimate meta-llama/Llama-3.1-8B --device h100_sxm --tp-size 1 --num-queries 1 --query-length 2048
	$(BIN)/perfcast estimate meta-llama/Llama-3.1-70B --device h100_sxm --tp-size 8 --num-queries 64 --query-length 1 --context-length 4096 --decode
	$(BIN)/perfcast serve meta-llama/Llama-3.1-70B --device h100_sxm --tp-size 8 --concurrency 64 --isl 1024 --osl 1024

# the workbench's browser tests drive Debian's headless Chromium (never a downloaded browser)
browser:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || \
	  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver)

test: venv browser
	$(BIN)/python -m pytest -n 2 tests

# the evidence workbench on http://127.0.0.1:8080/ (STORE=DIR for another evidence store)
workbench: $(VENV)/.installed-core
	$(BIN)/perfcast workbench $(if $(STORE),--store $(STORE))

bench: venv
	$(BIN)/python benchmarks/estimate_speed.py

clean:
	rm -rf $(VENV) build src/*.egg-info
