# make demo: create .venv, install, run the demo job on the `local` host.
# make test: install what the tests need, then lint, type-check and run the suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_WORKDIR ?= .demo
CONSOLE := $(PY) -m console --workdir $(DEMO_WORKDIR) local
DEMO_TRAIN_ARGS ?= --steps 400 --batch-size 8 --lr 3e-3 --log-every 20 --eval-every 100 --draft-vocab-size 512

.PHONY: demo test lint typecheck unit clean

# The SSH tests run a real OpenSSH server on 127.0.0.1 (Debian's openssh-server).
SSHD := /usr/sbin/sshd
TMUX := /usr/bin/tmux
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# SGLang's argument parser for the serve-flag tests: sglang without its runtime dependencies, kept out of
# .venv (the tests reach it through PYTHONPATH, as a serve command's own environment would).
SGLANG_PARSER ?= .sglang-parser
SGLANG_PARSER_VERSION ?= 0.5.23
# The real-SGLang tier: a Python of its own where SGLang's loader and model classes import on CPU
# (sglang-real-requirements.txt). Tests reach it through EAGLE3_SGLANG_PYTHON and never skip for want of it.
SGLANG_REAL ?= .sglang-real
# torch 2.13.0's CPU build, which this disk keeps, not SGLang 0.5.23's 2.14.1, a CUDA build (6.9 GB of tier, not 3.1),
# with the Triton it pairs with (SGLang imports it; the CUDA build brought it) and torchvision 0.28.0, a CUDA
# build on PyPI whose ops don't load beside it: sglang-real-torchvision.py lets it import.
SGLANG_REAL_TORCH ?= torch==2.13.0 triton==3.7.1 torchvision==0.28.0
# pip's cache would hold a second copy of every wheel it downloads (several GB for a CUDA build of
# torch): CI machines have run out of disk with it.
export PIP_NO_CACHE_DIR := 1
# pip compiles what it installs, as it must here: these machines set PYTHONDONTWRITEBYTECODE, so whatever is left
# uncompiled is compiled again by every process that imports it (without: an SGLang parser check took 2.5x as long).
PIP_INSTALL := install -q
# Two cores is what CI has (and the least a developer has).
JOBS ?= 2
# One worker more than the cores: a fifth of a 2-worker run's time both cores sat idle while tests waited on their
# processes (a grace, a poll, a tmux screen), and a third worker fills it.
TEST_WORKERS ?= 3

$(VENV)/.installed: pyproject.toml constraints-test.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip $(PIP_INSTALL) -c constraints-test.txt -e '.[host,test]'
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
	@echo "== to browse it in the terminal console (curves, logs; q quits): $(CONSOLE)"

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

$(SGLANG_PARSER)/.installed: sglang-parser-requirements.txt | $(VENV)/.installed
	rm -rf $(SGLANG_PARSER)
	$(PY) -m pip $(PIP_INSTALL) --target $(SGLANG_PARSER) --no-deps sglang==$(SGLANG_PARSER_VERSION)
	$(PY) -m pip $(PIP_INSTALL) --target $(SGLANG_PARSER) -r sglang-parser-requirements.txt
	touch $@

$(SGLANG_REAL)/.installed: sglang-real-requirements.txt sglang-real-torchvision.py
	rm -rf $(SGLANG_REAL)
	$(PYTHON) -m venv $(SGLANG_REAL)
	$(SGLANG_REAL)/bin/pip install -q --upgrade pip
	$(SGLANG_REAL)/bin/pip $(PIP_INSTALL) $(SGLANG_REAL_TORCH)
	$(SGLANG_REAL)/bin/pip $(PIP_INSTALL) --no-deps -r sglang-real-requirements.txt
	site=$$($(SGLANG_REAL)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') && \
		cp sglang-real-torchvision.py $$site/_sglang_real_torchvision.py && \
		echo 'import _sglang_real_torchvision' > $$site/_sglang_real_torchvision.pth
	$(SGLANG_REAL)/bin/python -W ignore -c "import sglang.srt.models.llama_eagle3, sglang.srt.model_loader.loader"
	touch $@

# The end-to-end console tests drive the console in a tmux terminal. One apt-get for both: two at once (make -j)
# would fight over dpkg's lock.
$(SSHD) $(TMUX) &:
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server tmux || \
		($(SUDO) apt-get update -q && \
		 $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server tmux)

TEST_NEEDS := $(VENV)/.installed $(SGLANG_PARSER)/.installed $(SGLANG_REAL)/.installed $(SSHD) $(TMUX)

# The suite mostly waits on processes, SSH and tmux: it runs on TEST_WORKERS workers (pytest-xdist), a worker
# that runs out of tests taking some of the other's (worksteal: a few tests take a minute, most a second).
# The 30 slowest are listed after the run (where the suite's time goes); PYTEST_ARGS adds options (-k, -x).
# Our sources are compiled first: under PYTHONDONTWRITEBYTECODE every CLI, agent and supervisor the suite starts
# would compile them again (a CLI and its agent: ~0.45 s of CPU, ~0.3 s with them compiled).
unit: $(TEST_NEEDS)
	$(PY) -m compileall -q -j $(JOBS) console backends themes tests benchmarks
	EAGLE3_SGLANG_PARSER_PATH=$(abspath $(SGLANG_PARSER)) EAGLE3_SGLANG_PYTHON=$(abspath $(SGLANG_REAL))/bin/python \
		$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=30 $(PYTEST_ARGS)

# CI's budget is 15 minutes on 2 cores, installs included: the installs and lint run two at a time (the real
# tier's install does not wait for .venv), then the type-check (~40 s of one core) runs beside the suite, in the
# time its workers wait on processes, SSH and tmux; each one's output is printed whole when it ends.
test:
	$(MAKE) -j$(JOBS) $(TEST_NEEDS) lint
	$(MAKE) -j2 --output-sync=target typecheck unit

clean:
	rm -rf $(VENV) $(SGLANG_PARSER) $(SGLANG_REAL) $(DEMO_WORKDIR) .mypy_cache .ruff_cache .pytest_cache .hypothesis
