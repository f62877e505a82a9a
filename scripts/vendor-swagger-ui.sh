#!/bin/sh
# Replace the vendored Swagger UI (app/server/dashboard/static/swagger/) with npm's swagger-ui-dist VERSION:
# the two files /docs loads, its license and notice. Needs npm; run from the repository root.
set -e
version="${1:?usage: scripts/vendor-swagger-ui.sh VERSION (e.g. 5.35.0)}"
dest=app/server/dashboard/static/swagger
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "swagger-ui-dist@$version" >/dev/null && tar xzf swagger-ui-dist-*.tgz)
for f in swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt swagger-ui.css LICENSE NOTICE; do
    cp "$work/package/$f" "$dest/$f"
done
echo "swagger-ui-dist $version (npm), Apache-2.0; refresh with scripts/vendor-swagger-ui.sh" > "$dest/VERSION"
echo "vendored swagger-ui-dist $version into $dest"
