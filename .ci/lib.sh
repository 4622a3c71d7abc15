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

# free_port: print a TCP port that is free on 127.0.0.1 right now.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_for_line FILE PATTERN [SECONDS]: wait until FILE has a line matching PATTERN; print it.
wait_for_line() {
    local file="$1" pattern="$2" deadline=$((SECONDS + ${3:-60}))
    while ((SECONDS < deadline)); do
        if grep -m1 -E "$pattern" "$file" 2>/dev/null; then return 0; fi
        sleep 0.2
    done
    echo "timed out waiting for /$pattern/ in $file" >&2
    cat "$file" "${file%.out}.err" >&2 2>/dev/null || true
    return 1
}

# start_stack DIR [FAIRQ_CMD...]: a simulated vLLM and a fairq with one admin key on free
# loopback ports, their logs in DIR. Sets SIM_URL, FAIRQ_TARGET, METRICS_URL, FAIRQ_API_KEY and
# STACK_PIDS. FAIRQ_CMD (default: .venv/bin/fairq, after `make sync`) is how fairq is started.
start_stack() {
    local dir="$1"; shift
    local fairq=("$@")
    ((${#fairq[@]})) || fairq=(.venv/bin/fairq)
    STACK_PIDS=()
    .venv/bin/fairq sim --mode vllm --port 0 --speed 10 >"$dir/sim.out" 2>"$dir/sim.err" &
    STACK_PIDS+=($!)
    SIM_URL="$(wait_for_line "$dir/sim.out" '^http://')"
    "${fairq[@]}" keys new --user ci-admin --admin --json >"$dir/key.json"
    FAIRQ_API_KEY="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["key"])' "$dir/key.json")"
    local port metrics
    port="$(free_port)"; metrics="$(free_port)"
    {
        echo "listen = \"127.0.0.1:$port\""
        echo "metrics_listen = \"127.0.0.1:$metrics\""
        echo "access_log = true"
        echo
        echo "[[backends]]"
        echo 'id = "sim-a"'
        echo 'kind = "vllm"'
        echo "base_url = \"$SIM_URL\""
        echo 'models = ["sim"]'
        echo
        python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["toml"])' "$dir/key.json"
    } >"$dir/fairq.toml"
    "${fairq[@]}" serve --config "$dir/fairq.toml" --grace 2 >"$dir/fairq.out" 2>"$dir/fairq.err" &
    STACK_PIDS+=($!)
    wait_for_line "$dir/fairq.out" '^fairq serving on' >/dev/null
    FAIRQ_TARGET="127.0.0.1:$port"
    METRICS_URL="http://127.0.0.1:$metrics/metrics"
    export SIM_URL FAIRQ_TARGET METRICS_URL FAIRQ_API_KEY
}

# stop_stack: SIGTERM what start_stack started (each by its pid) and wait for it.
stop_stack() {
    local pid
    for pid in "${STACK_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${STACK_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    STACK_PIDS=()
}
