#!/usr/bin/env bash
# Make sure Prometheus and promtool are installed (Debian's `prometheus` package).
# The tests check the exporter's output with promtool and scrape it with a private
# Prometheus on a free loopback port; they never use a system service.
set -euo pipefail
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/bin/$1" ]; }
if have prometheus && have promtool; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "vox-mqtt: Prometheus is missing. Install it with:" >&2
  echo "    sudo apt-get install prometheus" >&2
  echo "then run the make target again." >&2
  exit 1
fi
echo "vox-mqtt: installing Prometheus from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d 101 keeps the package's own prometheus.service from starting: the
# project does not need a system server, and a fixed port is someone else's.
policy=/usr/sbin/policy-rc.d
restore=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy" && restore=yes
fi
trap '[ -n "$restore" ] && rm -f "$policy"' EXIT
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
