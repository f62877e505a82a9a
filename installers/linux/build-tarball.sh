#!/bin/sh
# Build dist/switchyard-<version>-linux-<arch>.tar.gz: the bundle plus a .desktop file and icons, for
# distributions without dpkg (and in place of an AppImage where appimagetool is not available).
# The archive's install.sh puts it under ~/.local (no root): ~/.local/opt/switchyard,
# ~/.local/bin/switchyard, ~/.local/share/applications/switchyard.desktop and the hicolor icon.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUNDLE="$ROOT/dist/switchyard"
[ -x "$BUNDLE/switchyard" ] || { echo "no bundle at $BUNDLE: run 'make package' first" >&2; exit 1; }
VERSION=$("$BUNDLE/switchyard" --version | awk '{print $2}')
ARCH=$(uname -m)
NAME="switchyard-$VERSION-linux-$ARCH"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/$NAME/share/icons"
cp -a "$BUNDLE" "$STAGE/$NAME/switchyard"
cp "$ROOT/installers/linux/switchyard.desktop" "$STAGE/$NAME/share/switchyard.desktop"
cp "$ROOT/resources/icons/switchyard.svg" "$ROOT/resources/icons/switchyard-256.png" "$STAGE/$NAME/share/icons/"
cat > "$STAGE/$NAME/install.sh" <<'INSTALL'
#!/bin/sh
# Install for this user: ~/.local/opt/switchyard, ~/.local/bin/switchyard, a menu entry and the icon.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
PREFIX="${PREFIX:-$HOME/.local}"
rm -rf "$PREFIX/opt/switchyard"
mkdir -p "$PREFIX/opt" "$PREFIX/bin" "$PREFIX/share/applications" "$PREFIX/share/icons/hicolor/256x256/apps" "$PREFIX/share/icons/hicolor/scalable/apps"
cp -a "$HERE/switchyard" "$PREFIX/opt/switchyard"
ln -sf "$PREFIX/opt/switchyard/switchyard" "$PREFIX/bin/switchyard"
sed "s|^Exec=switchyard|Exec=$PREFIX/bin/switchyard|; s|^TryExec=switchyard|TryExec=$PREFIX/bin/switchyard|" \
    "$HERE/share/switchyard.desktop" > "$PREFIX/share/applications/switchyard.desktop"
cp "$HERE/share/icons/switchyard-256.png" "$PREFIX/share/icons/hicolor/256x256/apps/switchyard.png"
cp "$HERE/share/icons/switchyard.svg" "$PREFIX/share/icons/hicolor/scalable/apps/switchyard.svg"
echo "installed: $PREFIX/bin/switchyard (make sure $PREFIX/bin is on PATH)"
INSTALL
chmod 0755 "$STAGE/$NAME/install.sh"
OUT="$ROOT/dist/$NAME.tar.gz"
tar -C "$STAGE" -czf "$OUT" "$NAME"
echo "$OUT"
