# Chromium for the dashboard's browser test (tests/test_dashboard_browser.py): Debian's `chromium`, driven
# through the driver inside the playwright wheel with executable_path (never `playwright install`, which
# would download a browser build). Exports SYNAPOLIS_TEST_CHROMIUM. Idempotent.
if ! command -v chromium >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
fi
SYNAPOLIS_TEST_CHROMIUM="$(command -v chromium)"
export SYNAPOLIS_TEST_CHROMIUM
echo "ci: Chromium at $SYNAPOLIS_TEST_CHROMIUM"
