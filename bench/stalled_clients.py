"""Red-team figure: N streaming clients that send a request and then never read (issue 19).

For each front-end write timeout given, starts the release stack under `mlxcelctl serve`,
opens N connections with a small receive buffer, asks each for a long streamed chat
(`ignore_eos`, MAX_TOKENS tokens), reads nothing, and samples every second for SECONDS: the
front end's resident memory, and how many of the daemon's sequences still run. A connection
the front end gives up on (its writes made no progress for the write timeout) is cancelled in
the daemon, so `running` falls to 0; with a timeout longer than the run, nothing is cancelled,
which is how the front end behaved before `--write-timeout` existed.

Usage: .venv/bin/python bench/stalled_clients.py [--clients 8] [--seconds 60]
       [--timeouts 30s,1h] [--out DIR]
"""
import argparse
import json
import os
import socket
import time

import common


def stalled_client(port, model, max_tokens):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    body = json.dumps({
        "model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
        "temperature": 0, "messages": [{"role": "user", "content": "Tell me a very long story."}],
    }).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              b"Content-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    return s


def running(server):
    status, health = common.request(server.port, "GET", "/health", timeout=10)
    daemon = (health or {}).get("processes", {}).get("daemon", {}) or {}
    return daemon.get("running"), daemon.get("waiting")


def run(timeout, clients, seconds, max_tokens):
    server = common.Mlxcel(f"write-timeout {timeout}", {"MLXCEL_WRITE_TIMEOUT": timeout})
    try:
        fe = server.pids["frontend"]
        idle_rss = common.rss_bytes(fe)
        start = time.monotonic()
        model = common.request(server.port, "GET", "/v1/models")[1]["data"][0]["id"]
        socks = [stalled_client(server.port, model, max_tokens) for _ in range(clients)]
        samples, all_cancelled_s, seen_running = [], None, False
        while time.monotonic() - start < seconds:
            time.sleep(1)
            r, w = running(server)
            seen_running |= bool(r)
            t = round(time.monotonic() - start, 1)
            samples.append({"t": t, "frontend_rss": common.rss_bytes(fe), "running": r, "waiting": w})
            if seen_running and r == 0 and w == 0 and all_cancelled_s is None:
                all_cancelled_s = t
        peak = max(s["frontend_rss"] for s in samples)
        for s in socks:
            s.close()
        return {
            "write_timeout": timeout, "clients": clients, "seconds": seconds,
            "frontend_idle_rss": idle_rss, "frontend_peak_rss": peak,
            "running_at_end": samples[-1]["running"], "all_cancelled_after_s": all_cancelled_s,
            "samples": samples,
        }
    finally:
        server.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--timeouts", default="30s,1h")
    p.add_argument("--out")
    a = p.parse_args()
    results = {"machine": common.machine(), "runs": []}
    for timeout in a.timeouts.split(","):
        r = run(timeout, a.clients, a.seconds, a.max_tokens)
        results["runs"].append(r)
        mib = lambda b: f"{b / 2**20:.1f}" if b else "?"
        print(f"write timeout {timeout:>4}: front end RSS idle {mib(r['frontend_idle_rss'])} MiB, "
              f"peak {mib(r['frontend_peak_rss'])} MiB; running at {a.seconds} s: "
              f"{r['running_at_end']}; all {a.clients} cancelled after: "
              f"{r['all_cancelled_after_s'] or 'never'} s", flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "stalled_clients.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
