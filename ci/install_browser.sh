#!/usr/bin/env bash
# Headless Chromium and its driver for the web demos' browser tests (Debian's packages; selenium drives them).
# Installs them with apt where they are missing and this is root on a Debian/Ubuntu machine; elsewhere it says how,
# and the browser tests skip with that reason. Exit 0 either way: the rest of the suite does not need a browser.
set -uo pipefail
if command -v chromedriver >/dev/null && { command -v chromium >/dev/null || command -v chromium-browser >/dev/null; }; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "install_browser: apt-get install chromium chromium-driver (for the web demos' browser tests)"
    if DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null; then
        exit 0
    fi
    echo "install_browser: the install failed; the browser tests will skip"
else
    echo "install_browser: no chromium/chromedriver and no root apt-get here; the browser tests will skip" \
        "(install: apt-get install chromium chromium-driver)"
fi
exit 0
