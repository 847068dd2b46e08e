#!/usr/bin/env bash
# Make sure the Mosquitto broker and its command-line clients are installed.
# The tests start their own private broker; they never use a system service.
set -euo pipefail
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
if have mosquitto && have mosquitto_sub && have mosquitto_pub; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "vox-mqtt: Mosquitto is missing. Install it with:" >&2
  echo "    sudo apt-get install mosquitto mosquitto-clients" >&2
  echo "then run the make target again." >&2
  exit 1
fi
echo "vox-mqtt: installing Mosquitto from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends mosquitto mosquitto-clients >/dev/null
# The package enables a system broker on :1883; the project does not need it.
