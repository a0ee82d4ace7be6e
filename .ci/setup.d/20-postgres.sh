# PostgreSQL for the shared-store tests (contract §12): a throwaway server on a free 127.0.0.1 port.
# Exports SYNAPOLIS_TEST_PG_URL (tests/conftest.py reads it; with CI=true the PostgreSQL tests never skip)
# and SYNAPOLIS_TEST_PG_DIR (the cluster, for `scripts/synapolis-test-postgres stop`). Idempotent: a server
# already named by SYNAPOLIS_TEST_PG_DIR is reused (and kept); one started here is destroyed when .ci/run
# exits, so running it again on a workstation leaves no server behind (the run's exit status is kept).
if [ -z "${SYNAPOLIS_TEST_PG_DIR:-}" ]; then
  eval "$(scripts/synapolis-test-postgres start)"
  trap 'scripts/synapolis-test-postgres destroy "$SYNAPOLIS_TEST_PG_DIR" >/dev/null 2>&1 || true' EXIT
else
  eval "$(scripts/synapolis-test-postgres start "$SYNAPOLIS_TEST_PG_DIR")"
fi
echo "ci: PostgreSQL at ${SYNAPOLIS_TEST_PG_URL%%:*}://...@${SYNAPOLIS_TEST_PG_URL##*@}"
