# The real Codex CLI, Gemini CLI, Claude Code and opencode from npm, pinned to the versions docs/HOOKS.md was
# verified with, for tests/test_harness_binaries.py (Codex's own view of hook trust; Gemini and Claude
# Code running the installed hooks against a local stand-in for their model API). Only where npm is already there (an earlier step
# installs node); without it those tests skip. Idempotent: installs of the pinned versions under
# .ci/cache/harnesses are reused. Exports SYNAPOLIS_TEST_CODEX, SYNAPOLIS_TEST_GEMINI, SYNAPOLIS_TEST_CLAUDE, SYNAPOLIS_TEST_OPENCODE
# (opencode: tests/test_opencode_plugin.py), SYNAPOLIS_TEST_COPILOT (tests/test_copilot_hooks.py: BYOK, offline).
if command -v npm >/dev/null 2>&1; then
  harness_prefix="$PWD/.ci/cache/harnesses"
  for harness_pkg in "@openai/codex@0.171.0:codex:SYNAPOLIS_TEST_CODEX" \
                     "@google/gemini-cli@0.61.0:gemini:SYNAPOLIS_TEST_GEMINI" \
                     "@anthropic-ai/claude-code@2.1.332:claude:SYNAPOLIS_TEST_CLAUDE" \
                     "opencode-ai@1.18.33:opencode:SYNAPOLIS_TEST_OPENCODE" \
                     "@github/copilot@1.0.102:copilot:SYNAPOLIS_TEST_COPILOT"; do
    IFS=: read -r harness_spec harness_bin harness_var <<<"$harness_pkg"
    harness_version="${harness_spec##*@}"
    harness_exe="$harness_prefix/$harness_bin/node_modules/.bin/$harness_bin"
    if ! { [ -x "$harness_exe" ] && "$harness_exe" --version 2>/dev/null | grep -q "$harness_version"; }; then
      mkdir -p "$harness_prefix/$harness_bin"
      npm install --prefix "$harness_prefix/$harness_bin" --no-audit --no-fund --loglevel=error "$harness_spec" \
        >/dev/null || echo "ci: could not install $harness_spec; its tests will skip"
    fi
    if [ -x "$harness_exe" ]; then
      export "$harness_var=$harness_exe"
      echo "ci: $harness_bin $("$harness_exe" --version 2>/dev/null | grep -m1 -F "$harness_version")"
    fi
  done
fi
