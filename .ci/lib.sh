# Helpers shared by the .ci scripts (sourced, not run).

# python_for X.Y: print the path of a Python X.Y interpreter (pyenv's, else one on PATH).
python_for() {
    local version="$1" candidate
    for candidate in "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/"$version".*/bin/python"$version"; do
        [ -x "$candidate" ] && { echo "$candidate"; return 0; }
    done
    candidate="$(command -v "python$version" 2>/dev/null || true)"
    if [ -n "$candidate" ] && "$candidate" -c 'pass' 2>/dev/null; then
        echo "$candidate"
        return 0
    fi
    echo "no Python $version found (pyenv versions or python$version on PATH)" >&2
    return 1
}
