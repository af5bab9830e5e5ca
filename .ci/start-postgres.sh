#!/usr/bin/env bash
# Start a local PostgreSQL server for the tests marked `postgres`, installing it first if needed.
#
# Safe to run again: it reuses the installed server, the running cluster, the role and the database.
# Progress goes to stderr; stdout is one line to evaluate. Under `set -e`, assign first so that a
# failure stops the caller (an `eval "$(...)"` alone would hide it):
#   postgres_env=$(bash .ci/start-postgres.sh)
#   eval "$postgres_env"   # sets FULGOR_TEST_POSTGRES_URL
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # runuser lives there; a non-login root shell may lack it

ROLE=fulgor
PASSWORD=fulgor
DATABASE=fulgor_test
CLUSTER=main

log() { echo "start-postgres: $*" >&2; }

if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  log "installing PostgreSQL with apt"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q postgresql >&2
fi

VERSION=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
if ! pg_lsclusters -h | awk -v v="$VERSION" -v c="$CLUSTER" '$1 == v && $2 == c {found=1} END {exit !found}'; then
  log "creating cluster $VERSION/$CLUSTER"
  pg_createcluster "$VERSION" "$CLUSTER" >&2
fi
PORT=$(pg_lsclusters -h | awk -v v="$VERSION" -v c="$CLUSTER" '$1 == v && $2 == c {print $3}')
if ! pg_ctlcluster "$VERSION" "$CLUSTER" status >/dev/null 2>&1; then
  log "starting cluster $VERSION/$CLUSTER"
  pg_ctlcluster "$VERSION" "$CLUSTER" start >&2
else
  # Running, yet nobody answers on this loopback (pg_isready's status 2): the server was started in
  # another network namespace (by apt, or before .ci/run entered its own). Started again here,
  # where it then stays: outside this namespace it is reached again only after another restart
  # there. (Run as root: pg_ctlcluster switches to the postgres user.)
  answered=0
  pg_isready -q -h 127.0.0.1 -p "$PORT" || answered=$?
  if [ "$answered" -eq 2 ]; then
    log "restarting cluster $VERSION/$CLUSTER: it does not answer on this network namespace's loopback"
    pg_ctlcluster "$VERSION" "$CLUSTER" restart >&2
  fi
fi

for _ in $(seq 1 60); do
  pg_isready -q -h 127.0.0.1 -p "$PORT" && break
  sleep 0.5
done
pg_isready -h 127.0.0.1 -p "$PORT" >&2 || { log "the server on port $PORT did not come up; see /var/log/postgresql"; exit 1; }

as_postgres() { (cd / && runuser -u postgres -- psql -p "$PORT" -v ON_ERROR_STOP=1 -qtA "$@"); }
as_postgres -c "DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE') THEN
    CREATE ROLE $ROLE LOGIN PASSWORD '$PASSWORD';
  END IF;
END \$\$;" >&2
if [ "$(as_postgres -c "SELECT 1 FROM pg_database WHERE datname = '$DATABASE'")" != "1" ]; then
  log "creating database $DATABASE"
  as_postgres -c "CREATE DATABASE $DATABASE OWNER $ROLE" >&2
fi

# Test data need not survive a crash: commits that skip the WAL flush make the suite faster.
as_postgres -c "ALTER DATABASE $DATABASE SET synchronous_commit = off" >&2

log "ready on 127.0.0.1:$PORT"
echo "export FULGOR_TEST_POSTGRES_URL=postgresql://$ROLE:$PASSWORD@127.0.0.1:$PORT/$DATABASE"
