#!/bin/sh
# Build the Windows installer on Linux: the one-folder bundle with the Windows PyInstaller run as Windows
# code under wine (scripts/wine-setup.sh's prefix), then Debian's makensis on installers/windows/
# switchyard.nsi. Usage: installers/windows/build-nsis.sh [OUT_DIR]   (default dist/windows)
# Writes OUT_DIR/switchyard/ (the bundle) and OUT_DIR/switchyard-VERSION-setup.exe; prints the installer's
# path as its last line. NSIS_COMPRESSOR=zlib builds faster (the tests' choice) than the default lzma.
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "${1:-$root/dist/windows}" && cd "${1:-$root/dist/windows}" && pwd)
"$root/scripts/ensure-debian.sh" nsis
eval "$("$root/scripts/wine-setup.sh" | grep -E '^(WINEPREFIX|WINE_PYTHON)=')"
export WINEPREFIX WINEDEBUG=-all WINEARCH=win64 WINEDLLOVERRIDES="mscoree,mshtml="
version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
    "$root/pyproject.toml")

winpath() { echo "Z:$1" | sed 's|/|\\|g'; }
# python.exe under wine needs pipes for its standard streams, never a file
wpy() { env -u PIP_FIND_LINKS -u PIP_CERT -u PYTHONPATH PYTHONUTF8=1 wine "$WINE_PYTHON" "$@" </dev/null 2>&1 | cat; }

# a snapshot of the sources, so a build sees one consistent tree and leaves nothing in the checkout
src=$out/src
rm -rf "$src" "$out/build" "$out/switchyard"
mkdir -p "$src"
(cd "$root" && tar cf - --exclude=__pycache__ app resources installers build.spec pyproject.toml README.md) |
    (cd "$src" && tar xf -)
wine cmd /c exit </dev/null >/dev/null 2>&1  # wine's services start here, with no pipe to hold

echo "windows bundle: installing switchyard's metadata into the Windows Python" >&2
wpy -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation --no-index \
    "$(winpath "$src")" >"$out/pip.log"
echo "windows bundle: PyInstaller (as Windows code)" >&2
wpy -m PyInstaller --noconfirm --log-level WARN --distpath "$(winpath "$out")" \
    --workpath "$(winpath "$out/build")" "$(winpath "$src/build.spec")" >"$out/pyinstaller.log"
[ -f "$out/switchyard/switchyard.exe" ] || { echo "no bundle: see $out/pyinstaller.log" >&2; exit 1; }

echo "windows installer: makensis" >&2
setup=$out/switchyard-$version-setup.exe
makensis -V2 -DCOMPRESSOR="${NSIS_COMPRESSOR:-lzma}" -DVERSION="$version" -DBUNDLE="$out/switchyard" -DOUTFILE="$setup" \
    -DICON="$root/resources/icons/switchyard.ico" "$root/installers/windows/switchyard.nsi" >"$out/makensis.log"
echo "$setup"
