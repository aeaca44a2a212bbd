//! Every configuration key: where it lives in the file, the environment variable and flag that
//! override it, its default, what values it takes and what it means ([`table`]). The processes'
//! flags are checked against this table by their tests ([`crate::check::matches_command`]), so
//! the two cannot drift, and take their help text from it ([`crate::cli`]).

mod table;

pub use table::KEYS;

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
    /// `on` or `off`.
    Switch,
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
            Kind::Switch => "on or off",
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
    /// What it does, for `--help` and the settings reference.
    pub help: &'static str,
}

const fn key(
    section: Section,
    name: &'static str,
    env: &'static str,
    default: Option<&'static str>,
    kind: Kind,
    help: &'static str,
) -> Key {
    Key {
        section,
        name,
        env,
        default,
        kind,
        help,
    }
}

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
