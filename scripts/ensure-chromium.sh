#!/usr/bin/env bash
# Make sure Chromium and its WebDriver are installed (Debian's `chromium` and
# `chromium-driver` packages). The web console's tests drive a headless Chromium through
# /usr/bin/chromedriver with selenium; nothing is downloaded at test time.
set -euo pipefail
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/bin/$1" ]; }
if have chromium && have chromedriver; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "vox-mqtt: Chromium is missing. Install it with:" >&2
  echo "    sudo apt-get install chromium chromium-driver" >&2
  echo "then run the make target again." >&2
  exit 1
fi
echo "vox-mqtt: installing Chromium and chromium-driver from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
