#!/usr/bin/env bash
# Find or install a Chromium for `make browser-check`, wherever one can be had, and say loudly when none could.
#   scripts/install_browser.sh PYTHON
# Tried in order: $STEPSCOPE_BROWSER; chromium / chrome on PATH or in Playwright's browser cache (what
# `stepscope.report.browser_check.find_browser` looks at); Debian's chromium through apt-get (as root); Playwright's
# Chromium (`pip install playwright` into the given Python's environment, then `playwright install chromium`,
# which downloads from Playwright's CDN). BROWSER_INSTALL=0 installs nothing. Always exits 0: whether a missing
# browser fails the check is the check's decision (STEPSCOPE_REQUIRE_BROWSER=1, or CI).
set -u
PY=${1:-python3}

found() {
  "$PY" -c 'from stepscope.report.browser_check import find_browser; import sys; b = find_browser(); print(b or ""); sys.exit(b is None)'
}

if path=$(found); then
  echo "browser: $path"
  exit 0
fi
if [ -n "${STEPSCOPE_BROWSER:-}" ]; then
  echo "browser: STEPSCOPE_BROWSER=$STEPSCOPE_BROWSER is not an executable; not installing another"
  exit 0
fi
if [ "${BROWSER_INSTALL:-1}" != 1 ]; then
  echo "browser: none found, and BROWSER_INSTALL=0 installs none"
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "browser: installing Debian's chromium (apt-get)"
  if apt-get install -y -qq chromium >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; }; then
    path=$(found) && { echo "browser: $path"; exit 0; }
  fi
  echo "browser: apt-get could not install chromium"
fi
echo "browser: trying Playwright's Chromium (pip install playwright; playwright install chromium)"
if "$PY" -m pip install --quiet playwright >/dev/null 2>&1 && "$PY" -m playwright install chromium >/dev/null 2>&1; then
  path=$(found) && { echo "browser: $path"; exit 0; }
fi
echo "################################################################################"
echo "# browser: NO CHROMIUM could be found or installed here (apt-get as root, Playwright's"
echo "# download); the browser check cannot run. Install chromium or point STEPSCOPE_BROWSER at one."
echo "################################################################################"
exit 0
