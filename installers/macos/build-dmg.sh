#!/bin/sh
# macOS: dist/Switchyard.app (built by `make package`, the BUNDLE step of build.spec) into
# dist/Switchyard-<version>.dmg with an /Applications link to drag it onto. Needs hdiutil (macOS).
#
#   make package && installers/macos/build-dmg.sh
#   SIGN_ID="Developer ID Application: NAME (TEAMID)" installers/macos/build-dmg.sh   # also sign
#
# Notarizing (needs an Apple developer account) is documented in docs/install.md.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
APP="$ROOT/dist/Switchyard.app"
[ -d "$APP" ] || { echo "no $APP: run 'make package' on macOS first" >&2; exit 1; }
command -v hdiutil >/dev/null || { echo "hdiutil not found: build the disk image on macOS" >&2; exit 1; }
VERSION=$(/usr/libexec/PlistBuddy -c 'Print :CFBundleShortVersionString' "$APP/Contents/Info.plist")
if [ -n "${SIGN_ID:-}" ]; then
    codesign --force --deep --options runtime --timestamp --sign "$SIGN_ID" "$APP"
    codesign --verify --deep --strict "$APP"
fi
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
OUT="$ROOT/dist/Switchyard-$VERSION.dmg"
rm -f "$OUT"
hdiutil create -volname "Switchyard $VERSION" -srcfolder "$STAGE" -fs HFS+ -format UDZO -ov "$OUT" >/dev/null
[ -n "${SIGN_ID:-}" ] && codesign --force --sign "$SIGN_ID" "$OUT"
echo "$OUT"
