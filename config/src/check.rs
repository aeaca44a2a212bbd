//! The drift check between the key table and a process's flags.

use crate::keys::{Section, keys_of};

/// Checks that `command` (a process's flags) takes every key of `process` as a long flag with
/// the table's environment variable and default, and that none of its `MLXCEL_*` flags is
/// missing from the table.
pub fn matches_command(command: &clap::Command, process: Section) -> Result<(), String> {
    let mut problems = Vec::new();
    for key in keys_of(process) {
        if key.help.trim().is_empty() {
            problems.push(format!("{}: no help text in the table", key.name));
        }
        let Some(arg) = command
            .get_arguments()
            .find(|a| a.get_long() == Some(key.name))
        else {
            problems.push(format!("no --{} flag", key.name));
            continue;
        };
        let env = arg.get_env().and_then(|e| e.to_str());
        if env != Some(key.env) {
            problems.push(format!(
                "--{}: env {env:?}, table says {}",
                key.name, key.env
            ));
        }
        let default = arg.get_default_values().first().and_then(|d| d.to_str());
        if default != key.default {
            problems.push(format!(
                "--{}: default {default:?}, table says {:?}",
                key.name, key.default
            ));
        }
    }
    for arg in command.get_arguments() {
        let env = arg.get_env().and_then(|e| e.to_str()).unwrap_or("");
        let long = arg.get_long().unwrap_or("");
        if env.starts_with("MLXCEL_") && !keys_of(process).any(|k| k.name == long) {
            problems.push(format!(
                "--{long} ({env}) is not in the configuration table"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}
