#!/bin/sh
# Install the Debian packages named as arguments when they are missing: as root with apt-get,
# otherwise print the command for the user to run. No arguments: nothing to do.
set -e
[ "$#" -eq 0 ] && exit 0
command -v dpkg-query >/dev/null 2>&1 || { echo "not a Debian system; make sure these are installed: $*"; exit 0; }
missing=""
for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
    echo "installing Debian packages:$missing"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null; }
else
    echo "missing Debian packages:$missing — run: sudo apt-get install -y$missing" >&2
    exit 1
fi
