//! The table of keys: every setting of every process, with what it means. `--help` shows
//! each flag's text from here, `mlxcelctl config show` each key's value, and the README's
//! settings reference is this table (`mlxcelctl config reference`; a test keeps it equal).

use super::Kind::*;
use super::Section::*;
use super::{Key, key};

/// The whole table.
pub const KEYS: &[Key] = &[
    key(
        Common,
        "socket-dir",
        "MLXCEL_SOCKET_DIR",
        None,
        Text,
        "Directory for the sockets (default: $XDG_RUNTIME_DIR/mlxcel, else /tmp/mlxcel-<uid>).",
    ),
    key(
        Common,
        "log-level",
        "MLXCEL_LOG",
        Some("info"),
        Text,
        "Log filter: error, warn, info, debug, trace, or a tracing directive list.",
    ),
    key(
        Cachemgr,
        "capacity-bytes",
        "MLXCEL_CACHE_CAPACITY",
        Some("2GiB"),
        Size,
        "Cap on real bytes held for the cache (retained + being released), e.g. 512MiB, 2GiB.",
    ),
    key(
        Cachemgr,
        "max-blocks",
        "MLXCEL_CACHE_MAX_BLOCKS",
        None,
        Count,
        "Optional cap on the number of retained blocks.",
    ),
    key(
        Cachemgr,
        "idle-ttl",
        "MLXCEL_CACHE_IDLE_TTL",
        Some("off"),
        DurationOrOff,
        "Evict blocks unused for this long, e.g. 30m, 2h (\"off\" = never).",
    ),
    key(
        Cachemgr,
        "pin-share",
        "MLXCEL_CACHE_PIN_SHARE",
        Some("0.5"),
        Number,
        "Share of the capacity that prefixes pinned by requests (Anthropic `cache_control`) may \
         hold, 0 to 1; over it the oldest pin lapses first (its blocks stay cached, unpinned).",
    ),
    key(
        Cachemgr,
        "lease-timeout",
        "MLXCEL_CACHE_LEASE_TIMEOUT",
        Some("30s"),
        Duration,
        "Unpin a lease after this long even if the daemon never ends it (a daemon ends each \
         lease as soon as it has mapped the blocks, within milliseconds).",
    ),
    key(
        Cachemgr,
        "release-timeout",
        "MLXCEL_CACHE_RELEASE_TIMEOUT",
        Some("5s"),
        Duration,
        "Resend a release the daemon has not acknowledged after this long.",
    ),
    key(
        Cachemgr,
        "reconcile-interval",
        "MLXCEL_CACHE_RECONCILE_INTERVAL",
        Some("30s"),
        DurationOrOff,
        "Compare the ledger with the daemon's inventory this often (\"off\" = only on demand).",
    ),
    key(
        Cachemgr,
        "max-frame-bytes",
        "MLXCEL_MAX_FRAME_BYTES",
        Some("4MiB"),
        Size,
        "Largest IPC frame accepted, e.g. 4MiB (at most 64MiB).",
    ),
    key(
        Cachemgr,
        "hash-key-file",
        "MLXCEL_HASH_KEY_FILE",
        None,
        Text,
        "The secret that keys block hashes (created 0600 on first start), so entry ids cannot \
         be computed from a guessed prompt. Default: $XDG_STATE_HOME/mlxcel/hash-key, else \
         ~/.local/state/mlxcel/hash-key (macOS: ~/Library/Application Support/mlxcel/hash-key).",
    ),
    key(
        Cachemgr,
        "max-connections",
        "MLXCEL_CACHE_MAX_CONNECTIONS",
        Some("64"),
        Count,
        "Connections served at once.",
    ),
    key(
        Daemon,
        "model",
        "MLXCEL_MODEL",
        Some("default"),
        Text,
        "A .gguf file or an MLX / Hugging Face model directory; `default` is \
         models/SmolLM2-135M-Instruct.Q4_1.gguf (installed by `make setup`).",
    ),
    key(
        Daemon,
        "device",
        "MLXCEL_DEVICE",
        Some("auto"),
        Text,
        "Where the model runs: `auto` (a GPU if MLX has one: Metal on a Mac, CUDA with MLX's \
         CUDA build; else the CPU), `gpu` (or fail) or `cpu`. The startup log names the \
         backend.",
    ),
    key(
        Daemon,
        "kv-pool-bytes",
        "MLXCEL_KV_POOL_BYTES",
        Some("auto"),
        SizeOrAuto,
        "The most memory the paged KV pool may take, e.g. 1GiB (a ceiling: blocks take memory \
         as they are used and give it back when freed). `auto` = the cache capacity plus \
         --max-batch-size full contexts, at most half of the memory the pool lives in (physical \
         memory on the CPU, Metal's recommended working set on a Mac, the free device memory on \
         a CUDA GPU); the startup log shows the figures. A ceiling above that memory is \
         refused.",
    ),
    key(
        Daemon,
        "cache-capacity",
        "MLXCEL_CACHE_CAPACITY",
        Some("2GiB"),
        Size,
        "The cache manager's capacity (the same setting it reads), which an `auto` pool ceiling \
         makes room for.",
    ),
    key(
        Daemon,
        "block-tokens",
        "MLXCEL_BLOCK_TOKENS",
        Some("32"),
        Count,
        "Tokens per KV block (the unit the cache manager books).",
    ),
    key(
        Daemon,
        "prefill-chunk",
        "MLXCEL_PREFILL_CHUNK",
        Some("512"),
        Count,
        "Prompt tokens computed per engine step, across all requests (the prefill budget: a \
         burst of long prompts is prefilled over several steps while running requests keep \
         decoding; a prompt that does not fit what is left of a step waits for the next one, \
         where it comes first, and only a prompt longer than the budget is split).",
    ),
    key(
        Daemon,
        "max-batch-size",
        "MLXCEL_MAX_BATCH_SIZE",
        Some("8"),
        Count,
        "Sequences running at once; more wait in the queue.",
    ),
    key(
        Daemon,
        "warm-up-workers",
        "MLXCEL_WARM_UP_WORKERS",
        Some("auto"),
        WholeOrAuto,
        "Processes that build a first start's GPU kernels in parallel before the daemon's own \
         warm-up, each loading the model and running a share of the warm-up's shapes: `auto` \
         starts up to 8 on a CUDA GPU when the kernel cache is empty (MLX's CUDA backend builds \
         kernels one at a time; a fresh machine's first start can take minutes), at most half \
         the cores and as many copies of the weights as fit in half the device's free memory; a \
         number starts that many on any device; 0 none.",
    ),
    key(
        Daemon,
        "event-backlog",
        "MLXCEL_EVENT_BACKLOG",
        Some("16384"),
        Count,
        "Events (tokens, ends) queued for one front-end connection; a front end that lets more \
         pile up has stopped reading: its connection is closed and its requests cancelled.",
    ),
    key(
        Daemon,
        "max-frame-bytes",
        "MLXCEL_DAEMON_MAX_FRAME_BYTES",
        Some("32MiB"),
        Size,
        "Largest IPC frame (the model info frame carries the tokenizer), at most 64MiB.",
    ),
    key(
        Daemon,
        "acquire-timeout",
        "MLXCEL_ACQUIRE_TIMEOUT",
        Some("50ms"),
        Duration,
        "How long a request waits for the cache manager's answer to its prefix lookup, from its \
         arrival; past it the request runs without reuse (the manager never delays service).",
    ),
    key(
        Daemon,
        "donation-timeout",
        "MLXCEL_DONATION_TIMEOUT",
        Some("5s"),
        Duration,
        "How long a finished request's donation may go unanswered before the cache manager is \
         treated as gone (its blocks come back to the pool; the daemon reconnects).",
    ),
    key(
        Daemon,
        "default-temperature",
        "MLXCEL_DEFAULT_TEMPERATURE",
        None,
        Number,
        "Temperature for requests that omit it, when the model's generation_config.json does \
         not set one (default: 1, OpenAI's). Request values always win; 0 = greedy.",
    ),
    key(
        Daemon,
        "default-top-p",
        "MLXCEL_DEFAULT_TOP_P",
        None,
        Number,
        "top_p for requests that omit it, when the model's generation_config.json does not set \
         it (default: 1 = off).",
    ),
    key(
        Daemon,
        "default-top-k",
        "MLXCEL_DEFAULT_TOP_K",
        None,
        Whole,
        "top_k for requests that omit it, when the model's generation_config.json does not set \
         it (default: 0 = off).",
    ),
    key(
        Daemon,
        "default-min-p",
        "MLXCEL_DEFAULT_MIN_P",
        None,
        Number,
        "min_p for requests that omit it, when the model's generation_config.json does not set \
         it (default: 0 = off).",
    ),
    key(
        Daemon,
        "default-repetition-penalty",
        "MLXCEL_DEFAULT_REPETITION_PENALTY",
        None,
        Number,
        "repetition_penalty for requests that omit it, when the model's generation_config.json \
         does not set it (default: 1 = off).",
    ),
    key(
        Frontend,
        "host",
        "MLXCEL_HOST",
        Some("127.0.0.1"),
        Text,
        "Address to listen on. Anything but loopback requires --api-key.",
    ),
    key(
        Frontend,
        "port",
        "MLXCEL_PORT",
        Some("8080"),
        Port,
        "TCP port to listen on.",
    ),
    key(
        Frontend,
        "api-key",
        "MLXCEL_API_KEY",
        None,
        Secret,
        "Bearer token clients must send (`Authorization: Bearer <key>`) on every route but \
         /health. Prefer MLXCEL_API_KEY or --api-keys-file: arguments are visible in `ps`.",
    ),
    key(
        Frontend,
        "api-keys-file",
        "MLXCEL_API_KEYS_FILE",
        None,
        Text,
        "A file of API keys, one per line, each optionally followed by a tenant name. Tenants \
         never share cached prefixes; a key without a name is a tenant of its own.",
    ),
    key(
        Frontend,
        "admin-key",
        "MLXCEL_ADMIN_KEY",
        None,
        Secret,
        "The key the admin routes (/v1/cache/entries, /v1/cache/evict) require once any key is \
         set. Without it, only a lone --api-key may use them. Prefer MLXCEL_ADMIN_KEY: \
         arguments are visible to other users in `ps`.",
    ),
    key(
        Frontend,
        "allowed-hosts",
        "MLXCEL_ALLOWED_HOSTS",
        None,
        Text,
        "Host names served besides loopback ones and the bound address, comma-separated (`*` = \
         any). Others get 421: a web page rebinding its name to this machine is refused.",
    ),
    key(
        Frontend,
        "allowed-origins",
        "MLXCEL_ALLOWED_ORIGINS",
        None,
        Text,
        "Web page origins (`https://ui.example.com`) whose browser requests are served besides \
         loopback ones, comma-separated (`*` = any). Others get 403, CORS preflights included.",
    ),
    key(
        Frontend,
        "reasoning-inline",
        "MLXCEL_REASONING_INLINE",
        Some("off"),
        Switch,
        "Keep a reasoning model's thinking (`<think>...</think>`) in the answer's text instead of \
         reporting it apart (`reasoning_content`, Responses reasoning items, Anthropic thinking \
         blocks).",
    ),
    key(
        Frontend,
        "strip-billing-header",
        "MLXCEL_STRIP_BILLING_HEADER",
        Some("on"),
        Switch,
        "Drop the `x-anthropic-billing-header:` line Claude Code puts in its system prompt (it \
         changes on every request, so it would bust the prefix cache at its first tokens).",
    ),
    key(
        Frontend,
        "max-queue",
        "MLXCEL_MAX_QUEUE",
        Some("64"),
        Count,
        "Requests that may wait for their first token at once; more get 429.",
    ),
    key(
        Frontend,
        "max-connections",
        "MLXCEL_MAX_CONNECTIONS",
        Some("512"),
        Count,
        "Open HTTP connections served at once; one more gets 503 and is closed.",
    ),
    key(
        Frontend,
        "write-timeout",
        "MLXCEL_WRITE_TIMEOUT",
        Some("30s"),
        Duration,
        "A client that reads nothing of its response for this long is disconnected and its \
         generation cancelled (its blocks freed).",
    ),
    key(
        Frontend,
        "max-body-bytes",
        "MLXCEL_MAX_BODY_BYTES",
        Some("8MiB"),
        Size,
        "Largest request body, e.g. 8MiB; larger ones get 413.",
    ),
    key(
        Frontend,
        "header-timeout",
        "MLXCEL_HEADER_TIMEOUT",
        Some("10s"),
        Duration,
        "A request's headers must arrive within this long, or the connection is closed.",
    ),
    key(
        Frontend,
        "body-timeout",
        "MLXCEL_BODY_TIMEOUT",
        Some("30s"),
        Duration,
        "A request's body must arrive within this long, or it gets 408.",
    ),
    key(
        Frontend,
        "max-frame-bytes",
        "MLXCEL_DAEMON_MAX_FRAME_BYTES",
        Some("32MiB"),
        Size,
        "Largest IPC frame from the daemon (its model info carries the tokenizer), at most \
         64MiB.",
    ),
];
