# Two entry points (README Quick start): `make run` and `make test`. Both create .venv on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
PORT ?= 8501
# Every package `make run` and `make test` install, at the exact version CI had: pip honours it as
# constraints (-c), so a fresh machine gets the same numpy, BLAS wheel, pandas... as CI. Regenerate
# it with `make lock` after changing requirements*.txt. `pip install kvsim` keeps pyproject's ranges.
LOCK := requirements-lock.txt
PIP_VERSION := 26.3
SETUPTOOLS_VERSION := 84.2.1
PIP_TOOLS := pip-tools==7.7.0

.PHONY: run test clean lock

$(STAMP): requirements.txt pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q pip==$(PIP_VERSION) setuptools==$(SETUPTOOLS_VERSION)
	$(PY) -m pip install -q -r requirements.txt -c $(LOCK)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

run: $(STAMP)
	# kvsim dashboard serves the packaged entry script (not app.py: streamlit puts the script's folder
	# on sys.path, and the repository root would shadow other packages with our folder names)
	$(VENV)/bin/kvsim dashboard --port $(PORT)

$(TEST_STAMP): $(STAMP) requirements-test.txt $(LOCK)
	$(PY) -m pip install -q -r requirements-test.txt -c $(LOCK)
	touch $(TEST_STAMP)

# pip-compile (pip-tools) resolves requirements.txt and requirements-test.txt together; the CPU
# torch wheel's local label (+cpu) is dropped, so that the pin reads torch==2.13.0 as
# requirements.txt asks, which that wheel satisfies
lock: $(STAMP)
	$(PY) -m pip install -q $(PIP_TOOLS)
	$(PY) -m piptools compile --quiet --strip-extras --no-emit-index-url --no-emit-find-links \
		--output-file $(LOCK) requirements.txt requirements-test.txt
	sed -i -E 's/^(torch==[0-9.]+)\+cpu$$/\1/' $(LOCK)

test: $(TEST_STAMP)
	KVSIM_LOCK=$(LOCK) $(PY) -m pytest -q -n 2 --dist loadgroup tests

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
