#!/usr/bin/env bash
# Start the local PostgreSQL 15 cluster and create the test role and database.
# Prints the URL for TUNER_TEST_PG_URL; prints nothing when PostgreSQL is not installed.
set -euo pipefail
command -v pg_ctlcluster >/dev/null 2>&1 || exit 0
exec 3>&1 1>&2  # only the URL goes to standard output
pg_ctlcluster 15 main start 2>/dev/null || true  # "already running" is fine
for _ in $(seq 1 30); do
  su postgres -c "pg_isready -q -h 127.0.0.1 -p 5432" && break
  sleep 1
done
psql_as_postgres() { su postgres -c "psql -v ON_ERROR_STOP=1 -qtAc \"$1\""; }
[ "$(psql_as_postgres "SELECT 1 FROM pg_roles WHERE rolname='tuner'")" = 1 ] \
  || psql_as_postgres "CREATE ROLE tuner LOGIN PASSWORD 'tuner'" >/dev/null
[ "$(psql_as_postgres "SELECT 1 FROM pg_database WHERE datname='tuner_test'")" = 1 ] \
  || psql_as_postgres "CREATE DATABASE tuner_test OWNER tuner" >/dev/null
echo "postgresql+psycopg://tuner:tuner@127.0.0.1:5432/tuner_test" >&3
