# Two entry points (README Quick start): `make run` and `make test`. Both create .venv on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
PORT ?= 8501

.PHONY: run test clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

run: $(STAMP)
	# kvsim dashboard serves the packaged entry script (not app.py: streamlit puts the script's folder
	# on sys.path, and the repository root would shadow other packages with our folder names)
	$(VENV)/bin/kvsim dashboard --port $(PORT)

$(TEST_STAMP): $(STAMP) requirements-test.txt
	$(PY) -m pip install -q -r requirements-test.txt
	touch $(TEST_STAMP)

test: $(TEST_STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup tests

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
