"""Memory-footprint scenarios, side by side: mlxcel (default, small cache capacity, prompt cache
off) and mlx_lm.server on the same model, a fresh server per (configuration, scenario).

Every 250 ms it samples each process's resident memory (and on macOS its physical footprint,
which sees Metal buffers), and for mlxcel the cache manager's used/releasing/pinned bytes and
the pool's free blocks. It reports per-process peak and settle, cached tokens per request, and
PASS/FAIL checks: (1) ledger bytes == daemon inventory bytes at the end of every scenario;
(2) cache bytes <= capacity at every sample; (3) churn settle <= idle + capacity + 5%; (4) with a
small capacity, capacity evictions rise and the footprint stays bounded.

Usage: python bench/footprint.py [--configs a,b] [--scenarios x,y] [--out DIR]
Writes DIR/footprint.json (every sample) and DIR/footprint.md; bench/plot.py draws the charts.
"""
import argparse
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from common import MlxLm, Mlxcel, machine, phys_footprint_bytes, request, rss_bytes

GIB, MIB = 1 << 30, 1 << 20
CAPACITY = 2 * GIB
SMALL_CAPACITY = 64 * MIB
MAX_TOKENS = 16
SAMPLE_EVERY = 0.25
SETTLE_SECONDS = 5
EVICT_SECONDS = 10
SLACK = 64 * MIB


def system_prompt():
    """The shared prefix, like the seed's ~3.7k-token system prompt: deterministic, varied text of
    3,726 tokens in SmolLM2's tokenizer (140 rules of ~27 tokens)."""
    rules = [f"Rule {i}: in gallery {i % 17} the keeper of lens number {i * 7 % 101} logs the "
             f"{['tide', 'wind', 'fog', 'lamp', 'oil'][i % 5]} every {i % 9 + 1} hours." for i in range(140)]
    return "You are the archivist of a lighthouse museum. House rules follow.\n" + "\n".join(rules)


def document(k, sentences):
    """A distinct prompt of about 22 tokens per sentence."""
    return " ".join(f"Ledger {k}.{j}: ship {k * 31 + j} passed beacon {j * 13 % 97} carrying "
                    f"{(k + j) % 50} crates of {['salt', 'tea', 'coal', 'wool'][(k + j) % 4]}." for j in range(sentences))


def chat(port, messages):
    body = {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    status, r = request(port, "POST", "/v1/chat/completions", body)
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {r}")
    usage = r.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": cached,
            "text": r["choices"][0]["message"]["content"]}


def scenario_idle(port):
    time.sleep(20)
    return []


def scenario_shared_prefix_burst(port):
    system = system_prompt()
    ask = lambda i: chat(port, [{"role": "system", "content": system},
                               {"role": "user", "content": f"Question {i}: which rule mentions fog?"}])
    results = [ask(0)]
    with ThreadPoolExecutor(8) as pool:
        results += list(pool.map(ask, range(1, 9)))
    return results


def scenario_seqshare(port):
    system = system_prompt()
    return [chat(port, [{"role": "system", "content": system},
                        {"role": "user", "content": f"Question {i}: which rule mentions oil?"}]) for i in range(8)]


def scenario_multiturn(port):
    messages = [{"role": "system", "content": "You are a concise assistant."}]
    results = []
    for turn in range(8):
        messages.append({"role": "user", "content": f"Turn {turn}: {document(turn, 6)} Summarize it."})
        r = chat(port, messages)
        results.append(r)
        messages.append({"role": "assistant", "content": r["text"]})
    return results


def scenario_churn(port):
    return [chat(port, [{"role": "user", "content": document(100 + k, 22)}]) for k in range(32)]


def scenario_distinct_burst(port):
    ask = lambda k: chat(port, [{"role": "user", "content": document(500 + k, 90)}])
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(ask, range(8)))


SCENARIOS = {
    "idle": scenario_idle, "shared_prefix_burst": scenario_shared_prefix_burst,
    "seqshare": scenario_seqshare, "multiturn": scenario_multiturn, "churn": scenario_churn,
    "distinct_burst": scenario_distinct_burst,
}

# configuration -> (server, prompt-cache capacity in bytes). mlx_lm.server also keeps at most 10
# caches by default; `mlx_lm_bytes_only` lifts that, so that bytes alone bound its cache as they
# bound mlxcel's (not in the default run: --configs adds it).
CONFIGS = {
    "mlxcel": ("mlxcel", CAPACITY),
    "mlxcel_small_cache": ("mlxcel", SMALL_CAPACITY),
    "mlxcel_cache_off": ("mlxcel", 0),
    "mlx_lm": ("mlx_lm", CAPACITY),
}
EXTRA_CONFIGS = {"mlx_lm_bytes_only": ("mlx_lm", CAPACITY)}
ALL_CONFIGS = {**CONFIGS, **EXTRA_CONFIGS}


def start(config):
    """A fresh server for `config`."""
    server, capacity = ALL_CONFIGS[config]
    if server == "mlx_lm":
        return MlxLm(config, capacity, entries=1_000_000 if config.endswith("bytes_only") else None)
    return Mlxcel(config, {"MLXCEL_CACHE_CAPACITY": str(capacity)})


class Sampler(threading.Thread):
    def __init__(self, server):
        super().__init__(daemon=True)
        self.server, self.samples, self.stop_flag = server, [], threading.Event()
        self.t0 = time.monotonic()

    def run(self):
        while not self.stop_flag.is_set():
            t = time.monotonic() - self.t0
            sample = {"t": round(t, 3), "rss": {}, "footprint": {}}
            for name, pid in self.server.pids.items():
                sample["rss"][name] = rss_bytes(pid)
                fp = phys_footprint_bytes(pid)
                if fp is not None:
                    sample["footprint"][name] = fp
            try:
                sample["cache"] = self.server.cache()
            except OSError:
                sample["cache"] = None
            self.samples.append(sample)
            self.stop_flag.wait(SAMPLE_EVERY)


def total(sample):
    memory = sample["footprint"] or sample["rss"]
    return sum(v for v in memory.values() if v)


def run_one(config, scenario):
    server = start(config)
    sampler = Sampler(server)
    sampler.start()
    started = time.monotonic()
    error = None
    try:
        requests = SCENARIOS[scenario](server.port)
    except Exception as e:  # a failed scenario is reported, not hidden
        requests, error = [], repr(e)
    workload_s = time.monotonic() - started
    time.sleep(SETTLE_SECONDS)
    reconcile = server.reconcile()
    sampler.stop_flag.set()
    sampler.join()
    # mlxcel: `cache evict --all`, then the daemon's resident memory for 10 s.
    after_evict = []
    if server.kind == "mlxcel":
        server.evict_all()
        t0 = time.monotonic()
        while time.monotonic() - t0 < EVICT_SECONDS:
            after_evict.append((round(time.monotonic() - t0, 2), rss_bytes(server.pids["daemon"])))
            time.sleep(SAMPLE_EVERY)
    server.stop()
    samples = sampler.samples
    names = list(server.pids)
    peak = {n: max((s["rss"].get(n) or 0) for s in samples) for n in names}
    settle = {n: samples[-1]["rss"].get(n) for n in names}
    return {
        "config": config, "scenario": scenario, "kind": server.kind, "error": error,
        "workload_seconds": round(workload_s, 1), "requests": requests,
        "peak_rss": peak, "settle_rss": settle,
        "peak_total": max(total(s) for s in samples), "settle_total": total(samples[-1]),
        "reconcile": reconcile, "samples": samples, "after_evict": after_evict,
    }


def checks(results):
    """The PASS/FAIL checks, each with its numbers."""
    out = []
    by = {(r["config"], r["scenario"]): r for r in results}
    for r in results:
        if r["kind"] != "mlxcel":
            continue
        rec = r["reconcile"] or {}
        ok = rec.get("ledger_bytes") is not None and rec.get("ledger_bytes") == rec.get("inventory_bytes")
        out.append((f"{r['config']}/{r['scenario']}: ledger == daemon inventory", ok,
                    f"ledger {rec.get('ledger_bytes')} B, inventory {rec.get('inventory_bytes')} B"))
        cache = [s["cache"] for s in r["samples"] if s.get("cache")]
        worst = max((c["used_bytes"] + c["releasing_bytes"] for c in cache), default=0)
        cap = ALL_CONFIGS[r["config"]][1]
        out.append((f"{r['config']}/{r['scenario']}: cache bytes <= capacity at every sample",
                    bool(cache) and worst <= cap, f"max used+releasing {worst} B, capacity {cap} B, {len(cache)} samples"))
    for config in ("mlxcel", "mlxcel_small_cache", "mlx_lm", "mlx_lm_bytes_only"):
        idle, churn = by.get((config, "idle")), by.get((config, "churn"))
        if idle and churn:
            limit = (idle["settle_total"] + ALL_CONFIGS[config][1]) * 1.05
            out.append((f"{config}: churn settle <= idle + capacity + 5%", churn["settle_total"] <= limit,
                        f"churn settle {churn['settle_total'] / MIB:.0f} MiB, idle {idle['settle_total'] / MIB:.0f} MiB, "
                        f"limit {limit / MIB:.0f} MiB"))
    # What a user sees (issue "KV memory follows use"), per mlxcel scenario, the daemon's RSS
    # against its idle settle in the same configuration.
    for r in results:
        idle = by.get((r["config"], "idle"))
        if r["kind"] != "mlxcel" or not idle:
            continue
        base = idle["settle_rss"].get("daemon") or 0
        pools = [s["cache"] for s in r["samples"] if s.get("cache") and s["cache"].get("pool_block_bytes")]
        held = max(((c["pool_total_blocks"] - c["pool_free_blocks"]) * c["pool_block_bytes"] for c in pools), default=0)
        ledger = max((c["used_bytes"] + c["releasing_bytes"] for c in pools), default=0)
        running = max(0, held - ledger)
        limit = base + ledger + running + SLACK
        peak = r["peak_rss"].get("daemon") or 0
        out.append((f"{r['config']}/{r['scenario']}: peak <= idle + peak ledger + peak running KV + 64 MiB",
                    peak <= limit, f"daemon peak {peak / MIB:.0f} MiB, idle {base / MIB:.0f}, ledger {ledger / MIB:.0f}, "
                    f"running {running / MIB:.0f}, limit {limit / MIB:.0f} MiB"))
        back = next((t for t, v in r["after_evict"] if v and v <= base + SLACK), None)
        out.append((f"{r['config']}/{r['scenario']}: evict --all -> within idle + 64 MiB in 10 s", back is not None,
                    f"back after {back} s" if back is not None else
                    f"still {max(v or 0 for _, v in r['after_evict'][-1:]) / MIB:.0f} MiB, idle {base / MIB:.0f} MiB"))
        if r["config"] == "mlxcel_cache_off":
            out.append((f"mlxcel_cache_off/{r['scenario']}: no growth beyond running requests",
                        peak <= base + running + SLACK, f"daemon peak {peak / MIB:.0f} MiB, idle {base / MIB:.0f}, running {running / MIB:.0f}"))
    small_idle, small_churn = by.get(("mlxcel_small_cache", "idle")), by.get(("mlxcel_small_cache", "churn"))
    if small_idle and small_churn:
        limit = (small_idle["settle_total"] + SMALL_CAPACITY) * 1.05
        out.append(("mlxcel_small_cache: churn settles <= idle + 64 MiB + 5%", small_churn["settle_total"] <= limit,
                    f"settle {small_churn['settle_total'] / MIB:.0f} MiB, limit {limit / MIB:.0f} MiB"))
    for r in results:
        if r["config"] != "mlxcel_small_cache" or r["scenario"] not in ("churn", "distinct_burst", "shared_prefix_burst"):
            continue
        name = f"mlxcel_small_cache/{r['scenario']}: capacity evictions or refusals rise"
        cache = [s["cache"] for s in r["samples"] if s.get("cache")]
        if not cache:
            out.append((name, False, "no cache-manager samples"))
            continue
        first, last = cache[0], cache[-1]
        rose = last["evicted_capacity"] + last["rejected_capacity"] > first["evicted_capacity"] + first["rejected_capacity"]
        out.append((name, rose, f"evicted {last['evicted_capacity']} blocks, refused {last['rejected_capacity']}"))
    return out


def markdown(results, check_rows, info):
    lines = ["# Footprint", "", f"Machine: {info['system']}, {info['cpus']} CPUs; mlxcel {info['mlxcel']}; "
             f"packages {info['packages']}. Resident memory (RSS) sampled every {SAMPLE_EVERY} s; "
             f"settle = {SETTLE_SECONDS} s after the workload; fresh server per row; {MAX_TOKENS} tokens per request at temperature 0.", "",
             "| config | scenario | workload s | peak MiB (all processes) | settle MiB | per process peak / settle MiB | cached tokens per request | error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        procs = ", ".join(f"{n} {r['peak_rss'][n] / MIB:.0f}/{(r['settle_rss'][n] or 0) / MIB:.0f}" for n in r["peak_rss"])
        cached = " ".join(str(q.get("cached_tokens")) for q in r["requests"]) or "-"
        lines.append(f"| {r['config']} | {r['scenario']} | {r['workload_seconds']} | {r['peak_total'] / MIB:.0f} | "
                     f"{r['settle_total'] / MIB:.0f} | {procs} | {cached} | {r['error'] or ''} |")
    lines += ["", "| check | result | numbers |", "|---|---|---|"]
    lines += [f"| {name} | {'PASS' if ok else 'FAIL'} | {detail} |" for name, ok, detail in check_rows]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help=f"comma separated, of: {', '.join(ALL_CONFIGS)} (default: all but {', '.join(EXTRA_CONFIGS)})")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma separated, of: {', '.join(SCENARIOS)}")
    ap.add_argument("--out", default=os.path.join("bench", "results", time.strftime("%Y%m%d-%H%M%S")))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    info = machine()
    results = []
    for config in filter(None, args.configs.split(",")):
        for scenario in filter(None, args.scenarios.split(",")):
            print(f"[footprint] {config} / {scenario} ...", flush=True)
            r = run_one(config, scenario)
            print(f"[footprint] {config} / {scenario}: {r['workload_seconds']} s, peak {r['peak_total'] / MIB:.0f} MiB, "
                  f"settle {r['settle_total'] / MIB:.0f} MiB{', ERROR ' + r['error'] if r['error'] else ''}", flush=True)
            results.append(r)
            with open(os.path.join(args.out, "footprint.json"), "w") as f:
                json.dump({"machine": info, "results": results}, f)
    rows = checks(results)
    md = markdown(results, rows, info)
    with open(os.path.join(args.out, "footprint.md"), "w") as f:
        f.write(md)
    print(md)
    failed = [r for r in rows if not r[1]]
    raise SystemExit(1 if failed or any(r["error"] for r in results) else 0)


if __name__ == "__main__":
    main()
