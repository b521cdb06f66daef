# Sourced by the scripts that compare with Optuna (compare-optuna.sh,
# bench-search.sh): Optuna in a virtual environment, made once at $venv
# (PyPI must be reachable the first time); sets $py and $optuna_version.
if ! "$venv/bin/python" -c 'import optuna' 2>/dev/null; then
  echo "installing Optuna into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check optuna
fi
py=$venv/bin/python
optuna_version=$("$py" -c 'import optuna; print(optuna.__version__)')
