# make demo: create .venv, install, run the demo job on the `local` host.
# make test: install what the tests need, then lint, type-check and run the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_WORKDIR ?= .demo
CONSOLE := $(PY) -m console --workdir $(DEMO_WORKDIR) local

.PHONY: demo test lint typecheck unit clean

$(VENV)/.installed: pyproject.toml constraints-test.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints-test.txt -e '.[host,test]'
	touch $@

demo: $(VENV)/.installed
	@echo "== launching a short training-like run on the local host"
	$(CONSOLE) launch command --name demo -- $(PY) -m backends.demo_job
	$(CONSOLE) logs demo --follow
	@echo
	$(CONSOLE) status
	$(CONSOLE) metrics demo --tail 5

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

unit: $(VENV)/.installed
	$(PY) -m pytest -q

test: lint typecheck unit

clean:
	rm -rf $(VENV) $(DEMO_WORKDIR) .mypy_cache .ruff_cache .pytest_cache .hypothesis
