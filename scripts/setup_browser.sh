#!/usr/bin/env bash
# Debian's chromium and chromedriver, for the browser test of report.html
# (tests/evaluate/report/test_html.py). Idempotent: nothing to do when both are
# on PATH. As root it installs them (scripts/apt_install.sh); otherwise it says the browser
# tests will be skipped and exits 0. Selenium itself is a pinned Python package
# (requirements/common.txt), driving this chromedriver: it downloads nothing.
set -euo pipefail
PACKAGES=(chromium chromium-driver)

if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "setup-browser: chromium/chromedriver missing and not root with apt-get: the report.html browser test will be skipped (as root: apt-get install ${PACKAGES[*]})"
    exit 0
fi

echo "setup-browser: installing ${PACKAGES[*]}"
bash "$(dirname "$0")/apt_install.sh" setup-browser "${PACKAGES[@]}"
for binary in chromium chromedriver; do
    command -v "$binary" >/dev/null || { echo "setup-browser: $binary still missing after apt-get install ${PACKAGES[*]}" >&2; exit 1; }
done
echo "setup-browser: $(chromium --version 2>/dev/null | head -1), $(chromedriver --version 2>/dev/null | head -1)"
