# The two commands of the quick start: `make run` and `make test`. Both create or reuse .venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Debian packages the test suite needs (installed when root, otherwise named):
# the desktop screenshot test: an X server, Qt's xcb needs, a tray host, a screen grabber
DEBIAN_TEST_PACKAGES ?= xvfb libxcb-icccm4 libxcb-keysyms1 libxkbcommon-x11-0 libxcb-cursor0 trayer imagemagick xdotool
PYTEST_ARGS ?=

.PHONY: run serve test lint format typecheck pytest test-fast bench clean venv debian-deps package deb tarball

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Switchyard needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	@if [ -n "$$DISPLAY$$WAYLAND_DISPLAY" ] && $(PY) -c 'import app.ui.main' 2>/dev/null; then \
		exec $(VENV)/bin/switchyard; \
	else \
		echo "no display or no desktop UI installed: running headless (switchyard serve)"; \
		exec $(VENV)/bin/switchyard serve; \
	fi

serve: $(STAMP)
	$(VENV)/bin/switchyard serve

debian-deps:
	@scripts/ensure-debian.sh $(DEBIAN_TEST_PACKAGES)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: $(STAMP)
	$(VENV)/bin/mypy app

pytest: $(STAMP) debian-deps
	$(PY) -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

# everything but the checks marked slow
test-fast: PYTEST_ARGS += -m 'not slow'
test-fast: test

# dist/switchyard/ from build.spec (docs/install.md); PyInstaller comes from the [package] extra
package: $(STAMP)
	@$(PY) -c 'import PyInstaller' 2>/dev/null || $(PY) -m pip install --quiet -e '.[test,package]'
	$(PY) -m PyInstaller --noconfirm --log-level WARN build.spec

deb: package
	installers/linux/build-deb.sh

tarball: package
	installers/linux/build-tarball.sh

bench: $(STAMP)
	$(PY) bench/gateway_overhead.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
