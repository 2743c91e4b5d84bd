#!/bin/sh
# The official image's contract, in short: an empty data folder is initialised with
# POSTGRES_USER (superuser, password POSTGRES_PASSWORD, scram) and POSTGRES_DB; then the server
# runs as `postgres`, listening on every address of the container's network.
set -eu
BIN=/usr/lib/postgresql/15/bin
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
USER_NAME=${POSTGRES_USER:-postgres}
DB_NAME=${POSTGRES_DB:-$USER_NAME}
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s' "$POSTGRES_PASSWORD" > "$pwfile"
  chown postgres "$pwfile"
  as_postgres "$BIN/initdb" -D "$PGDATA" -U "$USER_NAME" --pwfile="$pwfile" \
    --auth-host=scram-sha-256 --auth-local=trust --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  if [ "$DB_NAME" != postgres ]; then
    echo "CREATE DATABASE \"$DB_NAME\" OWNER \"$USER_NAME\";" \
      | as_postgres "$BIN/postgres" --single -D "$PGDATA" postgres >/dev/null
  fi
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups \
  "$BIN/postgres" -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql
