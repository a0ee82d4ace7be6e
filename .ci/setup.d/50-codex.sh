# The real Codex CLI (npm @openai/codex, pinned: the version docs/HOOKS.md was verified with) for
# tests/test_harness_binaries.py, which asks Codex itself for the hash and trust status of installed
# hooks. Only where npm is already there (an earlier step installs node); without it the test skips.
# Idempotent: an install of the pinned version under .ci/cache/codex is reused. Exports SYNAPOLIS_TEST_CODEX.
SYNAPOLIS_CODEX_VERSION=0.171.0
if command -v npm >/dev/null 2>&1; then
  codex_prefix="$PWD/.ci/cache/codex"
  if [ ! -x "$codex_prefix/node_modules/.bin/codex" ] \
      || ! "$codex_prefix/node_modules/.bin/codex" --version 2>/dev/null | grep -q "$SYNAPOLIS_CODEX_VERSION"; then
    mkdir -p "$codex_prefix"
    npm install --prefix "$codex_prefix" --no-audit --no-fund --loglevel=error \
      "@openai/codex@$SYNAPOLIS_CODEX_VERSION" >/dev/null || echo "ci: could not install Codex; its test will skip"
  fi
  if [ -x "$codex_prefix/node_modules/.bin/codex" ]; then
    export SYNAPOLIS_TEST_CODEX="$codex_prefix/node_modules/.bin/codex"
    echo "ci: $("$SYNAPOLIS_TEST_CODEX" --version)"
  fi
fi
