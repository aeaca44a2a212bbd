//! `mlxcelctl config show`: the effective configuration of every process, each value with
//! where it came from (flag, environment variable, file and table, or default);
//! `mlxcelctl config reference`: every key with its meaning, as the README's settings table.

use std::path::Path;

use clap::Subcommand;
use mlxcel_config::{ConfigFile, Section, Setting, Source};

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the effective configuration and each value's source.
    Show {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print every setting with its flag, environment variable, default and meaning (Markdown).
    Reference,
}

/// `socket_flag`: `--socket-dir` when it was given on mlxcelctl's command line.
pub fn run(cmd: ConfigCommand, socket_flag: Option<&Path>) -> anyhow::Result<()> {
    let json = match cmd {
        ConfigCommand::Show { json } => json,
        ConfigCommand::Reference => {
            print!("{}", mlxcel_config::reference::markdown());
            return Ok(());
        }
    };
    let path = mlxcel_config::file::default_path();
    let file = ConfigFile::load()?;
    let env = mlxcel_config::process_env::variable;
    let flags: Vec<(&str, String)> = socket_flag
        .map(|d| vec![("socket-dir", d.to_string_lossy().into_owned())])
        .unwrap_or_default();
    let settings: Vec<Setting> = Section::PROCESSES
        .into_iter()
        .flat_map(|p| mlxcel_config::effective(p, &flags, &env, file.as_ref()))
        .collect();
    if json {
        let v = serde_json::json!({
            "file": path,
            "file_found": file.is_some(),
            "settings": settings,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    match (&path, &file) {
        (Some(p), Some(_)) => println!("configuration file: {}", p.display()),
        (Some(p), None) => println!(
            "configuration file: {} (none there: defaults apply)",
            p.display()
        ),
        (None, _) => println!("configuration file: none (HOME is not set)"),
    }
    let mut process = "";
    for s in &settings {
        if s.process != process {
            process = s.process;
            println!("[{process}]");
        }
        let value = s.value.as_deref().unwrap_or("(unset)");
        println!("  {:<20} {:<24} {}", s.key, value, source(&s.source));
    }
    Ok(())
}

fn source(s: &Source) -> String {
    match s {
        Source::Flag => "flag".into(),
        Source::Env { var } => format!("env {var}"),
        Source::File { path, section } => format!("file {} ({section})", path.display()),
        Source::Default => "default".into(),
        Source::Unset => String::new(),
    }
}
