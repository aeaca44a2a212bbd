"""What the benchmarks share: starting servers (mlxcel under `mlxcelctl serve`, or
`mlx_lm.server`), talking to them over HTTP, and measuring processes' memory.

Standard library only (plus matplotlib in plot.py). Paths are relative to the repository root.
"""
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The mlxcel binaries: the release build, or MLXCEL_BENCH_BIN (a GPU build carried elsewhere).
RELEASE = os.environ.get("MLXCEL_BENCH_BIN") or os.path.join(ROOT, "target", "release")
# The Python that runs mlx_lm.server: the project's venv, or MLXCEL_BENCH_PYTHON (the GPU
# machine's own, with the CUDA wheel on its PYTHONPATH).
PYTHON = os.environ.get("MLXCEL_BENCH_PYTHON") or os.path.join(ROOT, ".venv", "bin", "python")
GGUF = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
MLX_DIR = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct-mlx")
OPENBLAS = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, timeout=1800):
    """One HTTP request; returns (status, parsed JSON or None)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data else {}
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, None
    finally:
        conn.close()


def stream_chat(port, body, timeout=1800):
    """A streaming chat request: (ttft_s, total_s, completion_tokens or chunk count, usage)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    start = time.monotonic()
    ttft, chunks, usage = None, 0, None
    conn, r = answer(port, body, timeout)
    try:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"stream error: {event['error']}")
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    chunks += 1
                    if ttft is None:
                        ttft = time.monotonic() - start
    finally:
        conn.close()
    tokens = (usage or {}).get("completion_tokens", chunks)
    return ttft, time.monotonic() - start, tokens, usage


# Requests sent again because the server reset or refused the connection before answering
# (mlx_lm.server's listen backlog is 5: 32 clients connecting at once can see that).
RESENT = {"count": 0}


def answer(port, body, timeout, attempts=20):
    """Sends the chat request until the server answers (a reset or refused connection before any
    answer is sent again, counted in RESENT); returns the connection and its response."""
    for attempt in range(attempts):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})
            return conn, conn.getresponse()
        except (ConnectionResetError, ConnectionRefusedError, BrokenPipeError,
                http.client.RemoteDisconnected):
            conn.close()
            if attempt + 1 == attempts:
                raise
            RESENT["count"] += 1
            time.sleep(0.05 * (attempt + 1))


def rss_bytes(pid):
    """Resident memory of `pid` (bytes), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True)
    return int(out.stdout.strip()) * 1024 if out.stdout.strip() else None


def phys_footprint_bytes(pid):
    """macOS: physical footprint (sees Metal buffers, which RSS misses), else None."""
    if platform.system() != "Darwin" or not shutil.which("footprint"):
        return None
    out = subprocess.run(["footprint", "-p", str(pid)], capture_output=True, text=True)
    return parse_footprint(out.stdout)


def parse_footprint(text):
    """Bytes from `footprint` output: its `phys_footprint:` summary line, else the header's
    `Footprint: N UNIT`; None when neither is there (the format is not documented)."""
    units = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
    for key in ("phys_footprint:", "Footprint:"):
        for line in text.splitlines():
            if key not in line:
                continue
            words = line.split(key, 1)[1].split()
            try:
                value = float(words[0])
            except (IndexError, ValueError):
                continue
            unit = words[1] if len(words) > 1 else "B"
            return int(value * units.get(unit, 1))
    return None


def wait_for(what, check, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{what} within {timeout} s")


class Server:
    """A server process (`proc`) with its log and scratch directory."""

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Mlxcel(Server):
    """The mlxcel stack under `mlxcelctl serve`, with `env` on top of its defaults."""

    kind = "mlxcel"

    def __init__(self, name, env, serve_args=()):
        self.name, self.port = name, free_port()
        self.dir = tempfile.mkdtemp(prefix="mxb", dir="/tmp")
        self.env = {**os.environ, "MLXCEL_PORT": str(self.port), "MLXCEL_LOG": "warn",
                    "XDG_CONFIG_HOME": self.dir, **env}
        self.env.pop("MLXCEL_CONFIG", None)
        self.log = open(os.path.join(self.dir, "serve.log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(RELEASE, "mlxcelctl"), "serve", "--socket-dir", self.dir, *serve_args],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for("mlxcel answered /health", lambda: request(self.port, "GET", "/health", timeout=5)[0] == 200, 900)
        status = self.ctl("status", "--json")
        self.pids = {p["name"]: p["pid"] for p in status["processes"]}

    def ctl(self, *args):
        out = subprocess.run([os.path.join(RELEASE, "mlxcelctl"), *args, "--socket-dir", self.dir],
                             env=self.env, capture_output=True, text=True)
        return json.loads(out.stdout) if out.stdout.strip().startswith("{") else None

    def cache(self):
        """Cache figures: used/releasing/pinned/capacity bytes, evictions, pool free blocks."""
        s, stats = request(self.port, "GET", "/v1/cache/stats", timeout=5)
        h, health = request(self.port, "GET", "/health", timeout=5)
        if s != 200 or not stats:
            return None
        pool = ((health or {}).get("processes", {}).get("daemon", {}) or {}).get("pool") or {}
        return {
            "used_bytes": stats["used_bytes"], "releasing_bytes": stats["releasing_bytes"],
            "pinned_bytes": stats["pinned_bytes"], "capacity_bytes": stats["capacity_bytes"],
            "blocks": stats["blocks"], "evicted_capacity": stats["evicted_blocks"]["capacity"],
            "rejected_capacity": stats["rejected_blocks"]["capacity"],
            "pool_free_blocks": pool.get("free_blocks"), "pool_total_blocks": pool.get("total_blocks"),
            "pool_block_bytes": pool.get("block_bytes"), "pool_resident_bytes": pool.get("pool_bytes_measured"),
            "mlx_active_bytes": pool.get("mlx_active_bytes"), "mlx_cache_bytes": pool.get("mlx_cache_bytes"),
            "weights_bytes": pool.get("weights_bytes"),
        }

    def evict_all(self):
        subprocess.run([os.path.join(RELEASE, "mlxcelctl"), "cache", "evict", "--all", "--socket-dir", self.dir],
                       env=self.env, capture_output=True, text=True)

    def reconcile(self):
        return self.ctl("cache", "reconcile", "--json")


class MlxLm(Server):
    """`mlx_lm.server` on the same model exported as an MLX directory (float32; or `model`, a
    directory of any dtype), with OpenBLAS preloaded on Linux as mlxcel links it (not on a GPU),
    and its prompt cache capped at `cache_bytes` (and at `entries` caches, if given; its own
    default is 10)."""

    kind = "mlx_lm"

    def __init__(self, name, cache_bytes, model=MLX_DIR, gpu=False, entries=None):
        self.name, self.port = name, free_port()
        env = dict(os.environ)
        if platform.system() == "Linux" and os.path.exists(OPENBLAS) and not gpu:
            env["LD_PRELOAD"] = OPENBLAS
        self.dir = tempfile.mkdtemp(prefix="mxl", dir="/tmp")
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "mlx_lm.server", "--model", model, "--port", str(self.port),
             "--prompt-cache-bytes", str(cache_bytes)]
            + (["--prompt-cache-size", str(entries)] if entries else []),
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for("mlx_lm.server answered", lambda: request(self.port, "GET", "/v1/models", timeout=5)[0] == 200, 900)
        self.pids = {"mlx_lm.server": self.proc.pid}

    def cache(self):
        return None

    def reconcile(self):
        return None



def machine():
    """The machine and versions, recorded with every result."""
    def version(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except OSError:
            return None
    pip = {}
    for pkg in ("mlx", "mlx-cpu", "mlx-lm"):
        out = version([PYTHON, "-m", "pip", "show", pkg]) or ""
        pip[pkg] = next((l.split(": ", 1)[1] for l in out.splitlines() if l.startswith("Version:")), None)
    return {
        "system": platform.platform(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "mlxcel": version(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]),
        "packages": pip,
    }
