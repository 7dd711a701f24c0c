# Airflow environment for this repo. Source it (bash, zsh or sh) from anywhere:
#   . infra/airflow/airflow_env.sh
# Everything Airflow keeps (SQLite metadata DB, logs, generated config) lives under $AIRFLOW_HOME,
# by default <repo>/.airflow (gitignored); set AIRFLOW_HOME first to use another place (tests do).
# The repo root is found from this file under bash; other shells use $GEM_REPO, else the current
# directory, which must then be the repo root.

if [ -n "${BASH_SOURCE:-}" ]; then
    _gem_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
elif [ -n "${GEM_REPO:-}" ]; then
    _gem_repo="$GEM_REPO"
else
    _gem_repo="$(pwd)"
fi
if [ ! -f "$_gem_repo/dags/gem_daily.py" ]; then
    echo "airflow_env.sh: $_gem_repo is not the repo root (no dags/gem_daily.py); set GEM_REPO" >&2
    return 1 2>/dev/null || exit 1
fi
export GEM_REPO="$_gem_repo"

export AIRFLOW_HOME="${AIRFLOW_HOME:-$GEM_REPO/.airflow}"
mkdir -p "$AIRFLOW_HOME"
AIRFLOW_HOME="$(cd "$AIRFLOW_HOME" && pwd)"  # SQLite URLs must be absolute
export AIRFLOW_HOME

export AIRFLOW__CORE__DAGS_FOLDER="$GEM_REPO/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DEFAULT_TIMEZONE=utc
# Always the SQLite file of this AIRFLOW_HOME, so a second home never writes into the first's DB.
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///$AIRFLOW_HOME/airflow.db"
# One port for the API server; workers reach the execution API through the same URL.
# (`airflow dags test` runs tasks in-process and does not need the server.)
export AIRFLOW__API__PORT="${GEM_AIRFLOW_PORT:-8080}"
export AIRFLOW__API__BASE_URL="http://localhost:$AIRFLOW__API__PORT"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://localhost:$AIRFLOW__API__PORT/execution/"
# dags/ imports gem.*; the DAG processor only puts dags/ on sys.path.
case ":${PYTHONPATH:-}:" in
    *":$GEM_REPO:"*) ;;
    *) export PYTHONPATH="$GEM_REPO${PYTHONPATH:+:$PYTHONPATH}" ;;
esac
unset _gem_repo
