# node and npm for tests/clients/ (an independent MCP client: the TypeScript SDK 1.x), from Debian's
# packages when missing, then the locked dependencies (`npm ci`). Idempotent.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq nodejs npm >/dev/null
fi
(cd tests/clients && npm ci --no-audit --no-fund --loglevel=error)
echo "ci: node $(node --version), tests/clients installed"
