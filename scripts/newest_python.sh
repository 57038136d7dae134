#!/usr/bin/env bash
# Prints the absolute path of the newest CPython this project supports that runs here (3.13, then 3.12, 3.11):
# `pythonX.Y` on PATH, else a pyenv-installed X.Y that is not the active pyenv version (its shim alone fails).
# Used by `make test-latest`; exits 1 when none is found.
set -uo pipefail
for v in 3.13 3.12 3.11; do
  if exe=$("python$v" -c 'import sys; print(sys.executable)' 2>/dev/null); then
    echo "$exe"; exit 0
  fi
  if command -v pyenv >/dev/null 2>&1; then
    ver=$(pyenv versions --bare 2>/dev/null | grep -E "^$v(\.[0-9]+)?$" | sort -V | tail -n 1)
    if [ -n "$ver" ] && exe=$(PYENV_VERSION="$ver" "python$v" -c 'import sys; print(sys.executable)' 2>/dev/null); then
      echo "$exe"; exit 0
    fi
  fi
done
echo "newest_python.sh: no python3.13 / 3.12 / 3.11 found" >&2
exit 1
