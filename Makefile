# vox-mqtt — the README's commands. Everything a fresh machine needs is set up here.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: test demo bench lint mosquitto prometheus chromium install clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

mosquitto:
	@bash scripts/ensure-mosquitto.sh

prometheus:
	@bash scripts/ensure-prometheus.sh

chromium:
	@bash scripts/ensure-chromium.sh

# Four test processes on two cores: most tests wait on brokers, daemons and timers. With
# three, the suite used half of the two cores (10 min of CPU in 10 min 4 s of pytest time);
# with four, 8 min 12 s on the same tree. A module's tests stay in one process
# (--dist loadfile), so module-scoped brokers are shared as before. The 25 slowest tests
# are printed at the end: the suite's budget is 8 minutes of pytest time (README.md).
# The workers take modules heaviest first (tests/conftest.py RUN_FIRST), not xdist's
# most-tests-first: that order handed the one-test 100 s modules out last, to run alone.
# Bytecode is written even where the environment says not to (PYTHONDONTWRITEBYTECODE): the
# suite starts hundreds of Python processes from this checkout, and without a cache each
# compiled the package again (0.2 s of CPU apiece) and each worker rewrote every test module.
test: $(STAMP) mosquitto prometheus chromium
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n 4 --dist loadfile --no-loadscope-reorder \
		--durations=25 $(PYTEST_ARGS)

demo: $(STAMP) mosquitto
	$(BIN)/vox demo $(DEMO_ARGS)

bench: $(STAMP) mosquitto
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python -m bench $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check vox_mqtt agent_daemon examples tests bench
	$(BIN)/ruff format --check vox_mqtt agent_daemon examples tests bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# --- `sudo make install` on an agent or broker host (docs/deploy.md) -------------------------
# AGENT_CONFIGS=DIR   copy the files `vox agent render` wrote there into /etc/vox
# BROKER=1            also install the mosquitto.service drop-in for /etc/vox/broker
# DESTDIR=ROOT        stage into ROOT instead (INSTALL_VENV=no skips the Python install)
PREFIX       ?= /opt/vox-mqtt
BINDIR       ?= /usr/local/bin
UNITDIR      ?= /etc/systemd/system
SYSUSERSDIR  ?= /usr/lib/sysusers.d
CONFDIR      ?= /etc/vox
DESTDIR      ?=
INSTALL_VENV ?= yes
PIP_ARGS     ?=
AGENT_CONFIGS ?=
BROKER       ?=

install:
	@test "$(DESTDIR)" != "" -o "$$(id -u)" = 0 || { echo "make install: run as root (or set DESTDIR)"; exit 1; }
	@if [ "$(INSTALL_VENV)" = yes ]; then \
		$(PYTHON) -m venv $(DESTDIR)$(PREFIX) && \
		$(DESTDIR)$(PREFIX)/bin/python -m pip install --quiet --upgrade $(PIP_ARGS) . ; \
	fi
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(PREFIX)/share/doc
	ln -sf $(PREFIX)/bin/vox-agent $(DESTDIR)$(BINDIR)/vox-agent
	ln -sf $(PREFIX)/bin/vox $(DESTDIR)$(BINDIR)/vox
	install -m 0644 systemd/vox-agent@.service $(DESTDIR)$(UNITDIR)/vox-agent@.service
	install -m 0644 systemd/vox-exporter.service $(DESTDIR)$(UNITDIR)/vox-exporter.service
	install -m 0644 systemd/vox-web.service $(DESTDIR)$(UNITDIR)/vox-web.service
	install -D -m 0644 systemd/sysusers.d/vox.conf $(DESTDIR)$(SYSUSERSDIR)/vox.conf
	install -m 0644 docs/deploy.md $(DESTDIR)$(PREFIX)/share/doc/deploy.md
	install -m 0644 docs/metrics.md docs/vox-alerts.yml $(DESTDIR)$(PREFIX)/share/doc/
	@if [ -n "$(BROKER)" ]; then \
		install -D -m 0644 systemd/mosquitto.service.d/vox.conf \
			$(DESTDIR)$(UNITDIR)/mosquitto.service.d/vox.conf; \
	fi
	systemd-sysusers $(if $(DESTDIR),--root=$(DESTDIR)) $(DESTDIR)$(SYSUSERSDIR)/vox.conf
	install -d -m 0755 $(DESTDIR)$(CONFDIR)
	@# Configs and secrets: root-owned, readable by group vox only (the group exists once
	@# sysusers has run); /etc/vox itself stays 0755 so mosquitto can reach /etc/vox/broker.
	@if [ -n "$(AGENT_CONFIGS)" ]; then \
		cd "$(AGENT_CONFIGS)" && \
		find . -mindepth 1 -type d -exec install -d -m 0750 "$(DESTDIR)$(CONFDIR)/{}" \; && \
		find . -type f -exec install -m 0640 "{}" "$(DESTDIR)$(CONFDIR)/{}" \; && \
		if [ -z "$(DESTDIR)" ]; then find . -mindepth 1 -exec chgrp vox "$(CONFDIR)/{}" \; ; fi; \
	fi
	@if [ -z "$(DESTDIR)" ]; then \
		systemctl daemon-reload && \
		echo "installed: start an agent with systemctl enable --now vox-agent@NAME"; \
	fi
