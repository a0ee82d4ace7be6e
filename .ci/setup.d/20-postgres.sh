# PostgreSQL for the shared-store tests (contract §12): a throwaway server on a free 127.0.0.1 port.
# Exports SYNAPOLIS_TEST_PG_URL (tests/conftest.py reads it; with CI=true the PostgreSQL tests never skip)
# and SYNAPOLIS_TEST_PG_DIR (the cluster, for `scripts/synapolis-test-postgres stop`). Idempotent: a server
# already named by SYNAPOLIS_TEST_PG_DIR is reused.
eval "$(scripts/synapolis-test-postgres start "${SYNAPOLIS_TEST_PG_DIR:-}")"
echo "ci: PostgreSQL at ${SYNAPOLIS_TEST_PG_URL%%:*}://...@${SYNAPOLIS_TEST_PG_URL##*@}"
