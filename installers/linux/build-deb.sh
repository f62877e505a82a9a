#!/bin/sh
# Build dist/switchyard_<version>_<arch>.deb from the PyInstaller bundle in dist/switchyard/
# (make package first). Needs dpkg-deb only; runs as any user (--root-owner-group).
#
#   installers/linux/build-deb.sh                 # xz, the smallest download
#   DEB_COMPRESS=zstd installers/linux/build-deb.sh   # much faster to build (dpkg >= 1.21.18)
#
# Layout: /opt/switchyard (the bundle), /usr/bin/switchyard -> /opt/switchyard/switchyard,
# /usr/share/applications/switchyard.desktop, the icon in /usr/share/icons/hicolor.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUNDLE="$ROOT/dist/switchyard"
[ -x "$BUNDLE/switchyard" ] || { echo "no bundle at $BUNDLE: run 'make package' first" >&2; exit 1; }
command -v dpkg-deb >/dev/null || { echo "dpkg-deb not found: apt-get install dpkg-dev" >&2; exit 1; }

VERSION=$("$BUNDLE/switchyard" --version | awk '{print $2}')
ARCH=$(dpkg --print-architecture 2>/dev/null || echo amd64)
OUT="${DEB_OUT:-$ROOT/dist/switchyard_${VERSION}_${ARCH}.deb}"
STAGE=$(mktemp -d)
chmod 0755 "$STAGE"  # the package root: dpkg-deb records its mode
trap 'rm -rf "$STAGE"' EXIT

mkdir -p "$STAGE/DEBIAN" "$STAGE/opt" "$STAGE/usr/bin" "$STAGE/usr/share/applications"
cp -a "$BUNDLE" "$STAGE/opt/switchyard"
ln -s /opt/switchyard/switchyard "$STAGE/usr/bin/switchyard"
install -m 0644 "$ROOT/installers/linux/switchyard.desktop" "$STAGE/usr/share/applications/switchyard.desktop"
for px in 16 22 24 32 48 64 128 256 512; do
    d="$STAGE/usr/share/icons/hicolor/${px}x${px}/apps"
    mkdir -p "$d"
    install -m 0644 "$ROOT/resources/icons/switchyard-$px.png" "$d/switchyard.png"
done
mkdir -p "$STAGE/usr/share/icons/hicolor/scalable/apps"
install -m 0644 "$ROOT/resources/icons/switchyard.svg" "$STAGE/usr/share/icons/hicolor/scalable/apps/switchyard.svg"

SIZE_KB=$(du -sk "$STAGE" | awk '{print $1}')
cat > "$STAGE/DEBIAN/control" <<CONTROL
Package: switchyard
Version: $VERSION
Architecture: $ARCH
Maintainer: Switchyard developers <switchyard@localhost>
Installed-Size: $SIZE_KB
Depends: libc6 (>= 2.31)
Recommends: libgl1, libegl1, libfontconfig1, libxkbcommon0, libxkbcommon-x11-0, libxcb-cursor0, libdbus-1-3
Section: utils
Priority: optional
Homepage: https://github.com/switchyard/switchyard
Description: local AI models behind one OpenAI-compatible endpoint
 Switchyard routes each local model to a real engine (llama.cpp is built in)
 and serves one OpenAI-, Anthropic- and Ollama-compatible endpoint, with a
 desktop window and tray icon; "switchyard serve" runs it headless.
CONTROL

# refresh the menu and icon caches where the desktop has them; harmless where it does not
for script in postinst postrm; do
    cat > "$STAGE/DEBIAN/$script" <<'HOOK'
#!/bin/sh
set -e
if command -v update-desktop-database >/dev/null 2>&1; then update-desktop-database -q /usr/share/applications || true; fi
if command -v gtk-update-icon-cache >/dev/null 2>&1; then gtk-update-icon-cache -q -t -f /usr/share/icons/hicolor || true; fi
exit 0
HOOK
    chmod 0755 "$STAGE/DEBIAN/$script"
done

mkdir -p "$(dirname "$OUT")"
dpkg-deb --root-owner-group -Z"${DEB_COMPRESS:-xz}" --build "$STAGE" "$OUT" >/dev/null
echo "$OUT"
