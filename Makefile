# durafix: `make demo` runs the whole pipeline offline; `make test` runs the tests.
# `make soak` runs 50 repair runs under worker and Temporal server kills (durafix chaos).
# All of them install what they need first (Debian packages, uv, the venv), so they work on a fresh machine.

SHELL := /bin/bash
UV = $$(command -v uv || echo $$HOME/.local/bin/uv)
APT_PACKAGES := git nodejs chromium chromium-headless-shell fonts-noto-color-emoji docker.io debootstrap ffmpeg ca-certificates bubblewrap iproute2 util-linux socat prometheus
PYTEST_ARGS ?=
# Test processes: most tests wait on real servers, browsers and processes, so more processes than cores pay.
# Not more than 4 on 2 cores: with 6 the short soak's runs could no longer take their steps in time and none
# merged. Whole modules go to one process (module fixtures stand up a stack once); PYTEST_WORKERS=0 runs them
# in this one.
PYTEST_WORKERS ?= 4
# Modules are handed out in the order tests/conftest.py sorts them (the longest first): xdist's own default
# reorders them by how many tests each holds, which put the few-test modules that run for minutes last.
XDIST = -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder
# mypy's incremental cache lives outside the checkout, so a fresh clone re-checks only what changed.
export MYPY_CACHE_DIR ?= $(HOME)/.cache/durafix/mypy
# e.g. make soak SOAK_ARGS="--seed 42 --state-dir .durafix-soak"
SOAK_ARGS ?=

.PHONY: setup apt venv demo test test-quick test-kind test-docker-real lint bench bench-smoke soak clean

setup: apt venv

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# Bytecode is compiled here, for the dependencies and the project alike: a process started with
# PYTHONDONTWRITEBYTECODE set (as some shells and CI runners set it) otherwise compiles every module it imports
# from source at every start, about a second of CPU for each worker, receiver and CLI process of the tests.
venv:
	@command -v uv >/dev/null 2>&1 || [ -x "$$HOME/.local/bin/uv" ] || python3 -m pip install --quiet uv || python3 -m pip install --quiet --user uv
	@$(UV) sync --frozen --quiet --compile-bytecode

demo: setup
	$(UV) run durafix demo

test: setup
	$(UV) run ruff check .
	$(UV) run ruff format --check .
	$(UV) run lint-imports
	$(UV) run mypy
	$(UV) run pytest -m "not bench and not real_docker" $(XDIST) --durations=15 $(PYTEST_ARGS)

test-quick: setup
	$(UV) run pytest -m "not slow" -x -q $(XDIST) $(PYTEST_ARGS)

# One kind of test (a folder of tests/, see tests/README.md), e.g. `make test-kind KIND=unit`.
KIND ?= unit
test-kind: setup
	$(UV) run pytest -m "$(KIND) and not bench and not real_docker" -q $(XDIST) --durations=15 $(PYTEST_ARGS)

# The real-project tests on the Docker provider (tests/e2e/test_real_projects_docker.py): real npm ci and pip
# install in image builds, too long for `make test`. One module, one process.
test-docker-real: setup
	$(UV) run pytest -m real_docker -q --durations=15 $(PYTEST_ARGS)

lint: venv
	$(UV) run ruff check .
	$(UV) run ruff format --check .
	$(UV) run lint-imports
	$(UV) run mypy

bench: setup
	$(UV) run python -m tests.bench

# The benchmarks at their smallest size, checking what they measure (never how fast): each stands up a whole
# stack, so `make test` leaves them here.
bench-smoke: setup
	$(UV) run pytest -m bench $(PYTEST_ARGS)

soak: setup
	$(UV) run durafix chaos --runs 50 --workers 2 --kill-every 3-8 --server-kills 3 $(SOAK_ARGS)

clean:
	-$(UV) run durafix dev down
	rm -rf .durafix
