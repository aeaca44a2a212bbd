//! The committed agent plists and systemd units under `launchd/` are exactly what
//! `mlxcelctl install --dry-run` generates from the one service description (for a user `you`
//! with the binaries in /usr/local/bin). Change the description, then refresh the files with
//! `MLXCEL_WRITE_LAUNCHD=1 cargo test -p mlxcel-ctl --test launchd_files`.

use mlxcel_tests::serve as stack;

use std::path::{Path, PathBuf};

/// The files a dry run would write: (file name, content).
fn generated(manager: &str, home: &str, socket_dir: &str) -> Vec<(String, String)> {
    let out = std::process::Command::new(stack::bin("mlxcelctl"))
        .args(["install", "--dry-run", "--manager", manager])
        .args(["--bin-dir", "/usr/local/bin", "--socket-dir", socket_dir])
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("MLXCEL_CONFIG")
        .output()
        .expect("mlxcelctl install --dry-run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let mut files = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if line.starts_with("# ") || line.starts_with("$ ") {
            files.extend(current.take());
            if let Some(path) = line.strip_prefix("# write ") {
                let name = Path::new(path).file_name().unwrap().to_string_lossy();
                current = Some((name.into_owned(), String::new()));
            }
        } else if let Some((_, content)) = current.as_mut() {
            content.push_str(line);
            content.push('\n');
        }
    }
    files.extend(current);
    files
        .into_iter()
        .map(|(name, content)| (name, content.trim_end().to_string() + "\n"))
        .collect()
}

fn check(dir: &Path, files: Vec<(String, String)>) {
    assert_eq!(files.len(), 3, "one file per process: {files:?}");
    let write = std::env::var_os("MLXCEL_WRITE_LAUNCHD").is_some();
    for (name, content) in files {
        let path = dir.join(&name);
        if write {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(&path, &content).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (refresh with MLXCEL_WRITE_LAUNCHD=1)",
                path.display()
            )
        });
        assert_eq!(
            committed,
            content,
            "{} differs from the generator's output",
            path.display()
        );
    }
}

fn launchd_dir() -> PathBuf {
    mlxcel_tests::root().join("launchd")
}

#[test]
fn the_committed_plists_are_what_the_generator_writes() {
    check(
        &launchd_dir(),
        generated("launchd", "/Users/you", "/tmp/mlxcel-501"),
    );
}

#[test]
fn the_committed_systemd_units_are_what_the_generator_writes() {
    check(
        &launchd_dir().join("systemd"),
        generated("systemd", "/home/you", "/run/user/1000/mlxcel"),
    );
}
