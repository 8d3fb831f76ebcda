#!/usr/bin/env bash
# mypy over the `baton` package as it is installed: the repository keeps the role folders at the
# top (shared/ is the package itself, brain/ hands/ relay/ examples/ bench/ api/ are mounted under it
# by [tool.setuptools.package-dir]), so mypy, which cannot follow setuptools' editable import
# hook, checks a view of symlinks laid out like site-packages: build/typecheck/baton/...
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MYPY=${MYPY:-.venv/bin/mypy}
view=build/typecheck
rm -rf "$view"
mkdir -p "$view/baton"
for entry in shared/*; do
    ln -s "$PWD/$entry" "$view/baton/$(basename "$entry")"
done
for role in brain hands relay examples bench api; do
    ln -s "$PWD/$role" "$view/baton/$role"
done
cd "$view"
exec "$OLDPWD/$MYPY" --config-file "$OLDPWD/pyproject.toml" -p baton "$@"
