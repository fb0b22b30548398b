#!/usr/bin/env bash
# Start the local PostgreSQL 15 cluster and create the test role and database.
# Prints the URL for TUNER_TEST_PG_URL; prints nothing when PostgreSQL is not installed.
# Callers read the URL through a command substitution, which waits until every holder of its pipe
# has closed it: the server started here must therefore hold none of our file descriptors.
set -euo pipefail
command -v pg_ctlcluster >/dev/null 2>&1 || exit 0
say() { echo "start-postgres: $*" >&2; }
if ! pg_ctlcluster 15 main status >/dev/null 2>&1 </dev/null; then
  say "starting the 15/main cluster"
  timeout 120 pg_ctlcluster 15 main start </dev/null >/dev/null 2>&1 || say "pg_ctlcluster start failed"
fi
ready=0
for _ in $(seq 1 30); do
  if timeout 10 su postgres -c "pg_isready -q -h 127.0.0.1 -p 5432" </dev/null >/dev/null 2>&1; then ready=1; break; fi
  sleep 1
done
[ "$ready" = 1 ] || { say "PostgreSQL did not become ready on 127.0.0.1:5432"; exit 1; }
psql_as_postgres() { timeout 60 su postgres -c "psql -v ON_ERROR_STOP=1 -qtAc \"$1\"" </dev/null; }
[ "$(psql_as_postgres "SELECT 1 FROM pg_roles WHERE rolname='tuner'")" = 1 ] \
  || psql_as_postgres "CREATE ROLE tuner LOGIN PASSWORD 'tuner'" >/dev/null
[ "$(psql_as_postgres "SELECT 1 FROM pg_database WHERE datname='tuner_test'")" = 1 ] \
  || psql_as_postgres "CREATE DATABASE tuner_test OWNER tuner" >/dev/null
say "ready"
echo "postgresql+psycopg://tuner:tuner@127.0.0.1:5432/tuner_test"
