#!/usr/bin/env bash
# Start what the tests talk to, where it is installed here and not running, and wait until each
# answers:
#   PostgreSQL  127.0.0.1:5432  (pg_ctlcluster: the cluster on that port)
#   Redis       127.0.0.1:6379  (redis-server, loopback only, no persistence)
#   RabbitMQ    127.0.0.1:5672  (rabbitmq-server -detached), with the management plugin enabled
#               and its API on 127.0.0.1:15672 only (the RabbitMQ metrics source reads it)
# A service whose test variable (TEST_PG_ADMIN_DSN / TEST_PG_URL_TEMPLATE, TEST_REDIS_URL,
# TEST_AMQP_URL; see tests/conftest.py) points at another server is not started here, only
# checked to answer. Exits non-zero, saying what is missing and how to get it, when a service can
# neither be reached nor started. Starting services needs root (as in CI). Safe to re-run: a
# service that answers is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
failed=0

say() { printf 'services: %s\n' "$*"; }
fail() {
  printf 'services: ERROR: %s\n' "$*" >&2
  failed=1
}
have() { command -v "$1" >/dev/null 2>&1; }

# Where a DSN/URL points: "local" (loopback or a Unix socket, on the default port) or
# "elsewhere <host> <port>" (port "-" for a Redis Unix socket). Prints no password.
where() {
  "$PY" - "$1" "$2" <<'PYTHON'
import os, re, sys, urllib.parse

kind, value = sys.argv[1], sys.argv[2]
default = {"pg": 5432, "redis": 6379, "amqp": 5672}[kind]
tls = False
if kind == "pg" and "://" not in value:  # libpq keyword/value: host=... port=...
    pairs = dict(re.findall(r"(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", value))
    host = pairs.get("host", os.environ.get("PGHOST", "")).strip("'").split(",")[0]
    port = pairs.get("port", os.environ.get("PGPORT", "")).strip("'").split(",")[0]
else:
    u = urllib.parse.urlsplit(value)
    host = u.hostname or ""
    port = str(u.port or "")
    if kind == "pg":
        host = host or urllib.parse.parse_qs(u.query).get("host", [os.environ.get("PGHOST", "")])[0]
        port = port or os.environ.get("PGPORT", "")
    if u.scheme == "unix":
        host = u.path
    tls = u.scheme in ("rediss", "amqps")
port = int(port) if port else (5671 if kind == "amqp" and tls else default)
loopback = host in ("", "localhost", "127.0.0.1", "::1") or host.startswith("/")
if kind == "redis" and host.startswith("/"):
    print(f"elsewhere {host} -")  # a Unix socket: not the TCP server started here
elif loopback and not tls and port == default:
    print("local")
else:
    print(f"elsewhere {host or 'localhost'} {port}")
PYTHON
}

# Does host:port accept a TCP connection (within 3 s)?
answers_tcp() {
  "$PY" -c 'import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
except OSError:
    sys.exit(1)' "$1" "$2" 2>/dev/null
}

# Run `cmd...` every second until it succeeds, for up to $1 seconds.
wait_for() {
  local end=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$end" ] || return 1
    sleep 1
  done
}

check_elsewhere() { # name variable host port
  if { [ "$4" = - ] && [ -S "$3" ]; } || { [ "$4" != - ] && answers_tcp "$3" "$4"; }; then
    say "$1: using the server $2 points at ($3:$4); not starting a local one"
  else
    fail "$1: $2 points at $3:$4, which does not answer; start it, or unset $2 to use a local $1"
  fi
}

# ------------------------------------------------------------------ PostgreSQL
pg_admin=${TEST_PG_ADMIN_DSN:-host=127.0.0.1 port=5432 user=postgres dbname=postgres}
pg_template=${TEST_PG_URL_TEMPLATE:-}
[ -n "$pg_template" ] || pg_template='postgresql+psycopg://postgres@127.0.0.1:5432/{db}'
w=$(where pg "$pg_admin")
read -r pg_where pg_host pg_port <<<"$w"
w=$(where pg "$pg_template")
read -r tpl_where tpl_host tpl_port <<<"$w"

pg_up() {
  if have pg_isready; then pg_isready -q -h 127.0.0.1 -p 5432; else answers_tcp 127.0.0.1 5432; fi
}

if [ "$pg_where" != local ]; then
  check_elsewhere PostgreSQL TEST_PG_ADMIN_DSN "$pg_host" "$pg_port"
elif [ "$tpl_where" != local ]; then
  check_elsewhere PostgreSQL TEST_PG_URL_TEMPLATE "$tpl_host" "$tpl_port"
elif pg_up; then
  say "PostgreSQL: answering on 127.0.0.1:5432"
elif ! have pg_ctlcluster; then
  fail "PostgreSQL is not running on 127.0.0.1:5432 and is not installed here (no" \
    "pg_ctlcluster). Install it (Debian/Ubuntu: apt-get install postgresql), or set" \
    "TEST_PG_ADMIN_DSN and TEST_PG_URL_TEMPLATE to a server where the role may CREATE DATABASE"
else
  # the cluster on port 5432 (several PostgreSQL versions may be installed side by side)
  cluster=$(pg_lsclusters -h 2>/dev/null | awk '$3 == 5432 { print $1, $2; exit }')
  if [ -z "$cluster" ]; then
    fail "PostgreSQL is installed but has no cluster on port 5432 (see pg_lsclusters);" \
      "create one: pg_createcluster --port 5432 --start <version> main"
  else
    say "PostgreSQL: starting cluster $cluster"
    # shellcheck disable=SC2086 # "<version> <name>": two words
    if ! pg_ctlcluster --skip-systemctl-redirect $cluster start; then
      fail "could not start PostgreSQL cluster $cluster (starting services needs root)"
    elif wait_for 30 pg_up; then
      say "PostgreSQL: answering on 127.0.0.1:5432"
    else
      fail "PostgreSQL cluster $cluster did not answer on 127.0.0.1:5432 within 30 s" \
        "(see /var/log/postgresql/)"
    fi
  fi
fi
# Each test creates (and drops) its own database: the admin role must be allowed to.
if [ "$failed" = 0 ] && "$PY" -c 'import psycopg' 2>/dev/null; then  # nothing failed so far
  if ! why=$("$PY" - "$pg_admin" 2>&1 <<'PYTHON'
import sys

import psycopg

try:
    with psycopg.connect(sys.argv[1], connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
except psycopg.Error as exc:
    sys.exit(
        f"cannot connect with TEST_PG_ADMIN_DSN: {str(exc).strip().splitlines()[0]}. The default"
        " connects as 'postgres' over TCP without a password: that needs 'trust' for 127.0.0.1"
        " in pg_hba.conf, or a password in ~/.pgpass or PGPASSWORD"
    )
if not (row and row[0]):
    sys.exit("the role of TEST_PG_ADMIN_DSN may not CREATE DATABASE (ALTER ROLE ... CREATEDB)")
PYTHON
  ); then
    fail "PostgreSQL: $why"
  fi
fi

# ------------------------------------------------------------------ Redis
redis_url=${TEST_REDIS_URL:-redis://127.0.0.1:6379}
w=$(where redis "$redis_url")
read -r redis_where redis_host redis_port <<<"$w"

redis_up() {
  if have redis-cli; then
    [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = PONG ]
  else
    answers_tcp 127.0.0.1 6379
  fi
}

if [ "$redis_where" != local ]; then
  check_elsewhere Redis TEST_REDIS_URL "$redis_host" "$redis_port"
  have redis-server || fail "tests/brokers also start throwaway Redis servers of their own:" \
    "redis-server must be installed here (Debian/Ubuntu: apt-get install redis-server)"
elif redis_up; then
  say "Redis: answering on 127.0.0.1:6379"
elif ! have redis-server; then
  fail "Redis is not running on 127.0.0.1:6379 and is not installed here (no redis-server)." \
    "Install it (Debian/Ubuntu: apt-get install redis-server), or set TEST_REDIS_URL"
else
  say "Redis: starting redis-server on 127.0.0.1:6379 (no persistence)"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no
  if wait_for 30 redis_up; then
    say "Redis: answering on 127.0.0.1:6379"
  else
    fail "Redis did not answer on 127.0.0.1:6379 within 30 s"
  fi
fi

# ------------------------------------------------------------------ RabbitMQ
amqp_url=${TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672//}
w=$(where amqp "$amqp_url")
read -r amqp_where amqp_host amqp_port <<<"$w"
MGMT=http://127.0.0.1:15672
RABBIT_CONF=/etc/rabbitmq/rabbitmq.conf

amqp_up() { answers_tcp 127.0.0.1 5672 && rabbitmq-diagnostics -q check_running >/dev/null 2>&1; }
mgmt_up() {
  "$PY" -c 'import base64, sys, urllib.request
auth = "Basic " + base64.b64encode(b"guest:guest").decode()
req = urllib.request.Request(sys.argv[1] + "/api/overview", headers={"Authorization": auth})
urllib.request.urlopen(req, timeout=3).read()' "$MGMT" 2>/dev/null
}
# The management API on loopback only, also after the node's next restart.
mgmt_loopback_conf() {
  if [ -w "$(dirname "$RABBIT_CONF")" ] && ! grep -qs '^management.tcp.ip' "$RABBIT_CONF"; then
    echo 'management.tcp.ip = 127.0.0.1' >>"$RABBIT_CONF"
  fi
}

if [ "$amqp_where" != local ]; then
  check_elsewhere RabbitMQ TEST_AMQP_URL "$amqp_host" "$amqp_port"
  say "RabbitMQ: note that tests/brokers/test_rabbitmq.py also uses 127.0.0.1:5672 and the" \
    "management API on 127.0.0.1:15672 directly"
elif ! have rabbitmq-server; then
  if answers_tcp 127.0.0.1 5672 && mgmt_up; then
    say "RabbitMQ: answering on 127.0.0.1:5672, management API on $MGMT"
  else
    fail "RabbitMQ (with its management API on $MGMT) is not running and is not installed" \
      "here (no rabbitmq-server). Install it (Debian/Ubuntu: apt-get install rabbitmq-server)"
  fi
else
  if amqp_up; then
    say "RabbitMQ: answering on 127.0.0.1:5672"
  else
    mgmt_loopback_conf
    if rabbitmq-diagnostics -q ping >/dev/null 2>&1; then
      say "RabbitMQ: the node is up but its app is stopped: starting the app"
      if rabbitmqctl -q start_app; then started=yes; else started=no; fi
    else
      say "RabbitMQ: starting rabbitmq-server"
      if rabbitmq-server -detached; then started=yes; else started=no; fi
    fi
    if [ "$started" != yes ]; then
      fail "could not start RabbitMQ (starting services needs root)"
    elif wait_for 120 amqp_up; then
      say "RabbitMQ: answering on 127.0.0.1:5672"
    else
      fail "RabbitMQ did not answer on 127.0.0.1:5672 within 120 s (see /var/log/rabbitmq/)"
    fi
  fi
  if amqp_up; then
    if mgmt_up; then
      say "RabbitMQ: management API answering on $MGMT"
    else
      say "RabbitMQ: enabling the management plugin, on 127.0.0.1:15672 only"
      mgmt_loopback_conf
      # the running node read its config file at boot: give it the listener before the plugin
      rabbitmqctl eval \
        'application:set_env(rabbitmq_management, tcp_config, [{ip,"127.0.0.1"},{port,15672}]).' \
        >/dev/null
      rabbitmq-plugins -q enable rabbitmq_management >/dev/null
      if wait_for 60 mgmt_up; then
        say "RabbitMQ: management API answering on $MGMT"
      else
        fail "RabbitMQ management API did not answer on $MGMT within 60 s"
      fi
    fi
    if have ss && ss -Hltn 'sport = :15672' | awk '{ print $4 }' \
      | grep -qvE '^(127\.0\.0\.1|\[::1\]):'; then
      say "RabbitMQ: WARNING: the management API also listens beyond loopback" \
        "(set 'management.tcp.ip = 127.0.0.1' in $RABBIT_CONF and restart RabbitMQ)"
    fi
  fi
fi

exit "$failed"
