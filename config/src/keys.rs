//! Every configuration key: where it lives in the file, the environment variable and flag that
//! override it, its default and what values it takes. The processes' flags are checked against
//! this table by their tests ([`crate::check::matches_command`]), so the two cannot drift.

use std::fmt;

/// A part of the file: the top level (every process) or one process's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Section {
    /// Top-level keys, read by every process.
    Common,
    Cachemgr,
    Daemon,
    Frontend,
}

impl Section {
    pub const PROCESSES: [Section; 3] = [Section::Cachemgr, Section::Daemon, Section::Frontend];

    /// The table name in the file (`[daemon]`); empty for the top level.
    pub fn table(self) -> &'static str {
        match self {
            Section::Common => "",
            Section::Cachemgr => "cachemgr",
            Section::Daemon => "daemon",
            Section::Frontend => "frontend",
        }
    }

    pub fn from_table(name: &str) -> Option<Section> {
        Section::PROCESSES.into_iter().find(|s| s.table() == name)
    }
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Section::Common => f.write_str("top level"),
            s => write!(f, "[{}]", s.table()),
        }
    }
}

/// What values a key takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A byte size: `2GiB`, `512MiB` or a number of bytes.
    Size,
    /// A size or `auto`.
    SizeOrAuto,
    /// A duration: `30s`, `10m`, `2h`.
    Duration,
    /// A duration or `off`.
    DurationOrOff,
    /// A whole number ≥ 1.
    Count,
    /// A TCP port.
    Port,
    /// A finite decimal number (`0.7`, `1`).
    Number,
    /// A whole number ≥ 0.
    Whole,
    /// A whole number ≥ 0 or `auto`.
    WholeOrAuto,
    /// Free text.
    Text,
    /// Free text never printed (`config show` says whether it is set).
    Secret,
}

impl Kind {
    /// How a person should write a value of this kind.
    pub fn expected(self) -> &'static str {
        match self {
            Kind::Size => "a size such as 2GiB, 512MiB or a number of bytes",
            Kind::SizeOrAuto => "a size such as 2GiB, or \"auto\"",
            Kind::Duration => "a duration such as 30s, 10m or 2h",
            Kind::DurationOrOff => "a duration such as 30s, 10m or 2h, or \"off\"",
            Kind::Count => "a whole number of at least 1",
            Kind::Port => "a TCP port (1-65535)",
            Kind::Number => "a number such as 0.7",
            Kind::Whole => "a whole number (0 or more)",
            Kind::WholeOrAuto => "a whole number (0 or more), or \"auto\"",
            Kind::Text | Kind::Secret => "a string",
        }
    }
}

/// One key.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    pub section: Section,
    /// The key in the file, also the long flag's name.
    pub name: &'static str,
    /// The environment variable that overrides the file.
    pub env: &'static str,
    /// The default, as the flag takes it (None = unset).
    pub default: Option<&'static str>,
    pub kind: Kind,
}

const fn key(
    section: Section,
    name: &'static str,
    env: &'static str,
    default: Option<&'static str>,
    kind: Kind,
) -> Key {
    Key {
        section,
        name,
        env,
        default,
        kind,
    }
}

use Kind::*;
use Section::*;

/// The whole table.
pub const KEYS: &[Key] = &[
    key(Common, "socket-dir", "MLXCEL_SOCKET_DIR", None, Text),
    key(Common, "log-level", "MLXCEL_LOG", Some("info"), Text),
    key(
        Cachemgr,
        "capacity-bytes",
        "MLXCEL_CACHE_CAPACITY",
        Some("2GiB"),
        Size,
    ),
    key(
        Cachemgr,
        "max-blocks",
        "MLXCEL_CACHE_MAX_BLOCKS",
        None,
        Count,
    ),
    key(
        Cachemgr,
        "idle-ttl",
        "MLXCEL_CACHE_IDLE_TTL",
        Some("off"),
        DurationOrOff,
    ),
    key(
        Cachemgr,
        "lease-timeout",
        "MLXCEL_CACHE_LEASE_TIMEOUT",
        Some("30s"),
        Duration,
    ),
    key(
        Cachemgr,
        "release-timeout",
        "MLXCEL_CACHE_RELEASE_TIMEOUT",
        Some("5s"),
        Duration,
    ),
    key(
        Cachemgr,
        "reconcile-interval",
        "MLXCEL_CACHE_RECONCILE_INTERVAL",
        Some("30s"),
        DurationOrOff,
    ),
    key(
        Cachemgr,
        "max-frame-bytes",
        "MLXCEL_MAX_FRAME_BYTES",
        Some("4MiB"),
        Size,
    ),
    key(
        Cachemgr,
        "hash-key-file",
        "MLXCEL_HASH_KEY_FILE",
        None,
        Text,
    ),
    key(
        Cachemgr,
        "max-connections",
        "MLXCEL_CACHE_MAX_CONNECTIONS",
        Some("64"),
        Count,
    ),
    key(Daemon, "model", "MLXCEL_MODEL", Some("default"), Text),
    key(Daemon, "device", "MLXCEL_DEVICE", Some("auto"), Text),
    key(
        Daemon,
        "kv-pool-bytes",
        "MLXCEL_KV_POOL_BYTES",
        Some("auto"),
        SizeOrAuto,
    ),
    key(
        Daemon,
        "cache-capacity",
        "MLXCEL_CACHE_CAPACITY",
        Some("2GiB"),
        Size,
    ),
    key(
        Daemon,
        "block-tokens",
        "MLXCEL_BLOCK_TOKENS",
        Some("32"),
        Count,
    ),
    key(
        Daemon,
        "prefill-chunk",
        "MLXCEL_PREFILL_CHUNK",
        Some("512"),
        Count,
    ),
    key(
        Daemon,
        "max-batch-size",
        "MLXCEL_MAX_BATCH_SIZE",
        Some("8"),
        Count,
    ),
    key(
        Daemon,
        "warm-up-workers",
        "MLXCEL_WARM_UP_WORKERS",
        Some("auto"),
        WholeOrAuto,
    ),
    key(
        Daemon,
        "event-backlog",
        "MLXCEL_EVENT_BACKLOG",
        Some("16384"),
        Count,
    ),
    key(
        Daemon,
        "max-frame-bytes",
        "MLXCEL_DAEMON_MAX_FRAME_BYTES",
        Some("32MiB"),
        Size,
    ),
    key(
        Daemon,
        "acquire-timeout",
        "MLXCEL_ACQUIRE_TIMEOUT",
        Some("50ms"),
        Duration,
    ),
    key(
        Daemon,
        "donation-timeout",
        "MLXCEL_DONATION_TIMEOUT",
        Some("5s"),
        Duration,
    ),
    // Sampling for parameters a request omits, when the model's generation_config.json does
    // not set them (unset: the server's defaults).
    key(
        Daemon,
        "default-temperature",
        "MLXCEL_DEFAULT_TEMPERATURE",
        None,
        Number,
    ),
    key(
        Daemon,
        "default-top-p",
        "MLXCEL_DEFAULT_TOP_P",
        None,
        Number,
    ),
    key(Daemon, "default-top-k", "MLXCEL_DEFAULT_TOP_K", None, Whole),
    key(
        Daemon,
        "default-min-p",
        "MLXCEL_DEFAULT_MIN_P",
        None,
        Number,
    ),
    key(
        Daemon,
        "default-repetition-penalty",
        "MLXCEL_DEFAULT_REPETITION_PENALTY",
        None,
        Number,
    ),
    key(Frontend, "host", "MLXCEL_HOST", Some("127.0.0.1"), Text),
    key(Frontend, "port", "MLXCEL_PORT", Some("8080"), Port),
    key(Frontend, "api-key", "MLXCEL_API_KEY", None, Secret),
    key(
        Frontend,
        "api-keys-file",
        "MLXCEL_API_KEYS_FILE",
        None,
        Text,
    ),
    key(Frontend, "admin-key", "MLXCEL_ADMIN_KEY", None, Secret),
    key(
        Frontend,
        "allowed-hosts",
        "MLXCEL_ALLOWED_HOSTS",
        None,
        Text,
    ),
    key(
        Frontend,
        "allowed-origins",
        "MLXCEL_ALLOWED_ORIGINS",
        None,
        Text,
    ),
    key(Frontend, "max-queue", "MLXCEL_MAX_QUEUE", Some("64"), Count),
    key(
        Frontend,
        "max-connections",
        "MLXCEL_MAX_CONNECTIONS",
        Some("512"),
        Count,
    ),
    key(
        Frontend,
        "write-timeout",
        "MLXCEL_WRITE_TIMEOUT",
        Some("30s"),
        Duration,
    ),
    key(
        Frontend,
        "max-body-bytes",
        "MLXCEL_MAX_BODY_BYTES",
        Some("8MiB"),
        Size,
    ),
    key(
        Frontend,
        "header-timeout",
        "MLXCEL_HEADER_TIMEOUT",
        Some("10s"),
        Duration,
    ),
    key(
        Frontend,
        "body-timeout",
        "MLXCEL_BODY_TIMEOUT",
        Some("30s"),
        Duration,
    ),
    key(
        Frontend,
        "max-frame-bytes",
        "MLXCEL_DAEMON_MAX_FRAME_BYTES",
        Some("32MiB"),
        Size,
    ),
];

/// The keys a process reads: the top-level ones (which its own table may repeat, except
/// `socket-dir`, which every process must agree on) and its table's.
pub fn keys_of(process: Section) -> impl Iterator<Item = &'static Key> {
    KEYS.iter()
        .filter(move |k| k.section == Section::Common || k.section == process)
}

/// The key named `name` in `section` (a top-level key may also be set in a process's table).
pub fn find(section: Section, name: &str) -> Option<&'static Key> {
    KEYS.iter()
        .find(|k| k.section == section && k.name == name)
        .or_else(|| {
            (section != Section::Common && name != "socket-dir")
                .then(|| {
                    KEYS.iter()
                        .find(|k| k.section == Section::Common && k.name == name)
                })
                .flatten()
        })
}
