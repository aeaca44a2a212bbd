//! The settings reference: the key table as Markdown, one table per part of the file, for the
//! README (`mlxcelctl config reference` prints it; a test keeps the README's copy equal).

use crate::keys::{KEYS, Section};

/// The table as Markdown.
pub fn markdown() -> String {
    let mut out = String::new();
    for section in [
        Section::Common,
        Section::Cachemgr,
        Section::Daemon,
        Section::Frontend,
    ] {
        let title = match section {
            Section::Common => "Top level (every process)".to_string(),
            s => format!("`{s}`"),
        };
        out += &format!(
            "\n{title}\n\n| key (`--flag`) | environment | default | |\n|---|---|---|---|\n"
        );
        for k in KEYS.iter().filter(|k| k.section == section) {
            let default = k.default.map_or("-".to_string(), |d| format!("`{d}`"));
            let help = k.help.replace('|', "\\|");
            out += &format!("| `{}` | `{}` | {default} | {help} |\n", k.name, k.env);
        }
    }
    out
}
