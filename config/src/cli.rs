//! A process's command line, with each flag's help taken from the key table: one text per
//! setting, shown by `--help` and the README's settings reference alike.

use clap::{Command, Parser};

use crate::keys::{Section, keys_of};

/// `command` with the help text of each of `process`'s keys on its flag.
pub fn with_help(command: Command, process: Section) -> Command {
    command.mut_args(|arg| {
        let key = arg
            .get_long()
            .and_then(|long| keys_of(process).find(|k| k.name == long));
        match key {
            Some(k) => arg.help(k.help),
            None => arg,
        }
    })
}

/// Parses this process's command line (exits with clap's message and status on an error, or
/// after `--help` / `--version`).
pub fn parse<P: Parser>(process: Section) -> P {
    let matches = with_help(P::command(), process).get_matches();
    P::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}
