# make demo: create .venv, install, run the demo job on the `local` host.
# make test: install what the tests need, then lint, type-check and run the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_WORKDIR ?= .demo
CONSOLE := $(PY) -m console --workdir $(DEMO_WORKDIR) local
DEMO_TRAIN_ARGS ?= --steps 400 --batch-size 8 --lr 3e-3 --log-every 20 --eval-every 100 --draft-vocab-size 512

.PHONY: demo test lint typecheck unit clean

$(VENV)/.installed: pyproject.toml constraints-test.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints-test.txt -e '.[host,test]'
	touch $@

# The demo target is random (no download); extraction and training run as runs of the run engine.
demo: $(VENV)/.installed
	rm -rf $(DEMO_WORKDIR)
	@echo "== building the tiny random demo target"
	$(PY) -m backends.demo_target --out $(DEMO_WORKDIR)/target
	@echo "== extracting its hidden states over the built-in corpus (a run: progress rows below)"
	$(CONSOLE) extract --name demo-extract --follow --target $(DEMO_WORKDIR)/target --data demo \
		--out $(DEMO_WORKDIR)/hidden
	@echo "== training an EAGLE-3 draft on them (a run: loss and accuracy rows as they arrive)"
	$(CONSOLE) train --name demo-train --follow --data $(DEMO_WORKDIR)/hidden --target $(DEMO_WORKDIR)/target \
		--out $(DEMO_WORKDIR)/draft $(DEMO_TRAIN_ARGS)
	@echo "== checking the trained draft before it would be served"
	$(CONSOLE) doctor $(DEMO_WORKDIR)/draft/final --target $(DEMO_WORKDIR)/target --data $(DEMO_WORKDIR)/hidden
	$(CONSOLE) status

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
