//! `mlxcelctl install | uninstall | start | stop | restart`: the three services under the
//! platform's service manager (launchd agents on macOS, systemd user units on Linux), from the
//! one description in [`crate::service`]. `--dry-run` prints the files and commands instead.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, anyhow, bail};
use clap::{Args, ValueEnum};

use crate::service::{self, Layout, ServiceSpec, launchd, systemd};

/// What to do with the services.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Install,
    Uninstall,
    Start,
    Stop,
    Restart,
}

/// Which service manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Manager {
    Launchd,
    Systemd,
}

impl Manager {
    fn native() -> Manager {
        if cfg!(target_os = "macos") {
            Manager::Launchd
        } else {
            Manager::Systemd
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct ManageArgs {
    /// Print the files and commands without writing or running anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Directory of the mlxcel binaries (default: the one holding mlxcelctl).
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
    /// The service manager (default: launchd on macOS, systemd elsewhere); another one only
    /// makes sense with --dry-run.
    #[arg(long, value_enum)]
    pub manager: Option<Manager>,
}

/// Files to write or remove and commands to run, in order.
#[derive(Debug, Default)]
pub struct Plan {
    pub write: Vec<(PathBuf, String)>,
    pub remove: Vec<PathBuf>,
    pub mkdirs: Vec<PathBuf>,
    pub commands: Vec<Vec<String>>,
}

fn home() -> anyhow::Result<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("HOME is not set"))
}

fn config_home(home: &std::path::Path) -> PathBuf {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".config"))
}

/// The environment every service gets: the configuration file and socket directory this
/// `mlxcelctl` uses, when they are not the defaults.
fn service_env(socket_dir: Option<&std::path::Path>) -> Vec<(String, String)> {
    let mut env = Vec::new();
    if let Some(c) = mlxcel_config::process_env::config_file() {
        env.push((
            mlxcel_config::process_env::CONFIG_FILE.into(),
            c.to_string_lossy().into_owned(),
        ));
    }
    if let Some(dir) = socket_dir {
        env.push((
            "MLXCEL_SOCKET_DIR".into(),
            dir.to_string_lossy().into_owned(),
        ));
    }
    env
}

/// What `action` does with `manager` for these services.
pub fn plan(action: Action, manager: Manager, layout: &Layout) -> anyhow::Result<Plan> {
    let specs = service::services(layout);
    let mut plan = Plan::default();
    let text = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    match manager {
        Manager::Launchd => {
            let uid = nix::unistd::getuid().as_raw();
            let domain = format!("gui/{uid}");
            let target = |s: &ServiceSpec| format!("{domain}/{}", s.label);
            let path = |s: &ServiceSpec| launchd::plist_path(&layout.home, s);
            match action {
                Action::Install | Action::Start => {
                    if action == Action::Install {
                        plan.mkdirs.push(layout.log_dir());
                        for s in &specs {
                            plan.write.push((path(s), launchd::plist(s)?));
                        }
                    }
                    for s in &specs {
                        let p = path(s).to_string_lossy().into_owned();
                        plan.commands
                            .push(text(&["launchctl", "bootstrap", &domain, &p]));
                    }
                }
                Action::Uninstall | Action::Stop => {
                    for s in specs.iter().rev() {
                        plan.commands
                            .push(text(&["launchctl", "bootout", &target(s)]));
                    }
                    if action == Action::Uninstall {
                        plan.remove.extend(specs.iter().map(path));
                    }
                }
                Action::Restart => {
                    for s in &specs {
                        plan.commands
                            .push(text(&["launchctl", "kickstart", "-k", &target(s)]));
                    }
                }
            }
        }
        Manager::Systemd => {
            let dir = config_home(&layout.home);
            let units: Vec<String> = specs.iter().map(systemd::unit_name).collect();
            let systemctl = |verb: &[&str]| {
                let mut c = text(&["systemctl", "--user"]);
                c.extend(text(verb));
                c
            };
            let with_units = |mut c: Vec<String>| {
                c.extend(units.iter().cloned());
                c
            };
            match action {
                Action::Install => {
                    for s in &specs {
                        plan.write
                            .push((systemd::unit_path(&dir, s), systemd::unit(s)));
                    }
                    plan.commands.push(systemctl(&["daemon-reload"]));
                    plan.commands
                        .push(with_units(systemctl(&["enable", "--now"])));
                }
                Action::Uninstall => {
                    plan.commands
                        .push(with_units(systemctl(&["disable", "--now"])));
                    plan.remove
                        .extend(specs.iter().map(|s| systemd::unit_path(&dir, s)));
                    plan.commands.push(systemctl(&["daemon-reload"]));
                }
                Action::Start => plan.commands.push(with_units(systemctl(&["start"]))),
                Action::Stop => plan.commands.push(with_units(systemctl(&["stop"]))),
                Action::Restart => plan.commands.push(with_units(systemctl(&["restart"]))),
            }
        }
    }
    Ok(plan)
}

/// Runs `action` (or prints it with `--dry-run`).
pub fn run(
    action: Action,
    args: &ManageArgs,
    socket_dir: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let bin_dir = match &args.bin_dir {
        Some(d) => d.clone(),
        None => service::default_bin_dir().context("cannot find mlxcelctl's directory")?,
    };
    if !args.dry_run && matches!(action, Action::Install) {
        for p in service::Process::ALL {
            let bin = bin_dir.join(p.binary());
            if !bin.exists() {
                bail!(
                    "{} is missing: build with `make build` or pass --bin-dir",
                    bin.display()
                );
            }
        }
    }
    let layout = Layout {
        bin_dir,
        home: home()?,
        env: service_env(socket_dir),
    };
    let manager = args.manager.unwrap_or_else(Manager::native);
    let plan = plan(action, manager, &layout)?;
    if args.dry_run {
        print_plan(&plan);
        return Ok(());
    }
    execute(&plan)
}

fn print_plan(plan: &Plan) {
    for dir in &plan.mkdirs {
        println!("# mkdir -p {}", dir.display());
    }
    for (path, text) in &plan.write {
        println!("# write {}\n{text}", path.display());
    }
    for path in &plan.remove {
        println!("# remove {}", path.display());
    }
    for c in &plan.commands {
        println!("$ {}", c.join(" "));
    }
}

fn execute(plan: &Plan) -> anyhow::Result<()> {
    for dir in &plan.mkdirs {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    for (path, text) in &plan.write {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    let mut failed = Vec::new();
    for c in &plan.commands {
        println!("$ {}", c.join(" "));
        match Command::new(&c[0]).args(&c[1..]).status() {
            Ok(s) if s.success() => {}
            Ok(s) => failed.push(format!("`{}` exited with {s}", c.join(" "))),
            Err(e) => failed.push(format!("cannot run `{}`: {e}", c[0])),
        }
    }
    for path in &plan.remove {
        match std::fs::remove_file(path) {
            Ok(()) => println!("removed {}", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => failed.push(format!("cannot remove {}: {e}", path.display())),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("{}", failed.join("; "))
    }
}
