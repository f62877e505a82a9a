#!/bin/sh
# Installs the two coding agents the agent tests run for real (Claude Code, Codex CLI) from the npm registry
# into a per-machine cache, once; later calls only print the bin folder. Versions are pinned so a test run
# does not change behaviour when the registry publishes a new release.
# Usage: scripts/ensure-agents.sh   -> prints the folder holding `claude` and `codex`
set -eu
CLAUDE_CODE_VERSION="${SWITCHYARD_CLAUDE_CODE_VERSION:-2.1.332}"
CODEX_VERSION="${SWITCHYARD_CODEX_VERSION:-0.171.0}"
ROOT="${SWITCHYARD_AGENTS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard-agents}"
DIR="$ROOT/claude-$CLAUDE_CODE_VERSION-codex-$CODEX_VERSION"
if [ -x "$DIR/node_modules/.bin/claude" ] && [ -x "$DIR/node_modules/.bin/codex" ] && [ -f "$DIR/.installed" ]; then
    echo "$DIR/node_modules/.bin"
    exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "npm is not installed: install Node.js 18 or newer (Debian: nodejs npm)" >&2; exit 2; }
mkdir -p "$DIR"
# a private prefix: nothing global is touched, and a half-finished install is redone (no .installed stamp)
npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" >&2
touch "$DIR/.installed"
echo "$DIR/node_modules/.bin"
