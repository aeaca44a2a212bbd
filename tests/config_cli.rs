//! Configuration end to end: `mlxcelctl config show` with each value's source, the precedence
//! file < environment < flag as a real process applies it, clear errors for bad keys, and the
//! service manager plans (`--dry-run`).

use mlxcel_tests::{http, serve as stack};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use stack::bin;

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn ctl(config: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin("mlxcelctl"));
    c.args(args).env("MLXCEL_CONFIG", config);
    for var in [
        "MLXCEL_PORT",
        "MLXCEL_MAX_QUEUE",
        "MLXCEL_LOG",
        "MLXCEL_SOCKET_DIR",
    ] {
        c.env_remove(var);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn config_show_reports_each_value_and_where_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "log-level = \"warn\"\n[daemon]\nlog-level = \"debug\"\n[frontend]\nport = 9001\nmax-queue = 3\n",
    );
    let out = ctl(
        &config,
        &["config", "show", "--json"],
        &[("MLXCEL_MAX_QUEUE", "7")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let get = |process: &str, key: &str| {
        v["settings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["process"] == process && s["key"] == key)
            .unwrap()
            .clone()
    };
    assert_eq!(get("frontend", "port")["value"], "9001");
    assert_eq!(get("frontend", "port")["source"]["kind"], "file");
    assert_eq!(get("frontend", "port")["source"]["section"], "[frontend]");
    assert_eq!(get("frontend", "max-queue")["value"], "7");
    assert_eq!(
        get("frontend", "max-queue")["source"]["var"],
        "MLXCEL_MAX_QUEUE"
    );
    assert_eq!(get("daemon", "log-level")["value"], "debug");
    assert_eq!(get("cachemgr", "log-level")["value"], "warn");
    assert_eq!(
        get("cachemgr", "log-level")["source"]["section"],
        "top level"
    );
    assert_eq!(
        get("cachemgr", "capacity-bytes")["source"]["kind"],
        "default"
    );
    assert_eq!(get("cachemgr", "capacity-bytes")["value"], "2GiB");
    let out = ctl(&config, &["config", "show", "--socket-dir", "/tmp/x"], &[]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains(&format!("configuration file: {}", config.display())),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.contains("socket-dir") && l.contains("/tmp/x") && l.contains("flag")),
        "{table}"
    );
}

/// Starts `mlxcel-frontend` (no daemon needed) and returns the port it listens on among `ports`.
fn frontend_port(config: &Path, env: &[(&str, String)], args: &[String], ports: &[u16]) -> u16 {
    let sockets = mlxcel_tests::temp_dir("mxc");
    let mut c = Command::new(bin("mlxcel-frontend"));
    c.arg("--socket-dir")
        .arg(sockets.path())
        .args(args)
        .env("MLXCEL_CONFIG", config);
    c.env_remove("MLXCEL_PORT")
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let port = loop {
        if let Some(p) = ports
            .iter()
            .find(|&&p| http::request(p, "GET", "/health", None).is_ok())
        {
            break *p;
        }
        assert!(
            Instant::now() < deadline,
            "the front end listened on none of {ports:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    port
}

#[test]
fn a_real_process_takes_the_file_then_the_environment_then_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let ports = [http::free_port(), http::free_port(), http::free_port()];
    let config = write_config(dir.path(), &format!("[frontend]\nport = {}\n", ports[0]));
    assert_eq!(frontend_port(&config, &[], &[], &ports), ports[0]);
    let env = [("MLXCEL_PORT", ports[1].to_string())];
    assert_eq!(frontend_port(&config, &env, &[], &ports), ports[1]);
    let flag = ["--port".to_string(), ports[2].to_string()];
    assert_eq!(frontend_port(&config, &env, &flag, &ports), ports[2]);
}

#[test]
fn unknown_keys_and_bad_values_stop_every_process_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "[daemon]\nkv-pol-bytes = \"1GiB\"\n");
    for name in ["mlxcel-cachemgr", "mlxcel-frontend", "mlxcel-daemon"] {
        let out = Command::new(bin(name))
            .env("MLXCEL_CONFIG", &config)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains("unknown key `kv-pol-bytes` in [daemon]"),
            "{name}: {err}"
        );
        assert!(err.contains(&config.display().to_string()), "{name}: {err}");
    }
    let config = write_config(dir.path(), "[cachemgr]\ncapacity-bytes = \"lots\"\n");
    let out = ctl(&config, &["config", "show"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("`capacity-bytes` in [cachemgr] must be a size"),
        "{err}"
    );
    let missing = dir.path().join("absent.toml");
    let out = ctl(&missing, &["config", "show"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("absent.toml"),
        "{err}"
    );
}

#[test]
fn dry_runs_print_the_files_and_the_service_manager_commands() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let home = dir.path().to_string_lossy().into_owned();
    let env = [("HOME", home.as_str()), ("XDG_CONFIG_HOME", home.as_str())];
    let run = |args: &[&str]| {
        let out = ctl(&config, args, &env);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let uid = nix::unistd::getuid().as_raw();
    let out = run(&["install", "--dry-run", "--manager", "launchd"]);
    for name in ["cachemgr", "daemon", "frontend"] {
        let plist = format!("{home}/Library/LaunchAgents/com.mlxcel.{name}.plist");
        assert!(out.contains(&format!("# write {plist}")), "{out}");
        assert!(
            out.contains(&format!("$ launchctl bootstrap gui/{uid} {plist}")),
            "{out}"
        );
    }
    assert!(
        out.contains(&format!(
            "<string>{}</string>",
            bin("mlxcel-daemon").display()
        )),
        "{out}"
    );
    let out = run(&["restart", "--dry-run", "--manager", "launchd"]);
    assert!(
        out.contains(&format!(
            "$ launchctl kickstart -k gui/{uid}/com.mlxcel.daemon"
        )),
        "{out}"
    );
    let out = run(&["uninstall", "--dry-run", "--manager", "launchd"]);
    assert!(
        out.contains(&format!(
            "$ launchctl bootout gui/{uid}/com.mlxcel.frontend"
        )),
        "{out}"
    );
    let out = run(&["install", "--dry-run", "--manager", "systemd"]);
    assert!(
        out.contains(&format!(
            "# write {home}/systemd/user/mlxcel-daemon.service"
        )),
        "{out}"
    );
    assert!(out.contains("$ systemctl --user enable --now mlxcel-cachemgr.service mlxcel-daemon.service mlxcel-frontend.service"), "{out}");
    assert!(out.contains("After=mlxcel-cachemgr.service"), "{out}");
    let out = run(&["stop", "--dry-run", "--manager", "systemd"]);
    assert!(
        out.contains("$ systemctl --user stop mlxcel-cachemgr.service"),
        "{out}"
    );
    // Nothing was written.
    assert!(!dir.path().join("Library").exists() && !dir.path().join("systemd").exists());
}

#[test]
fn the_readmes_settings_reference_is_the_key_table_and_help_shows_it() {
    let out = Command::new(bin("mlxcelctl"))
        .args(["config", "reference"])
        .output()
        .expect("mlxcelctl config reference");
    assert!(out.status.success());
    let reference = String::from_utf8(out.stdout).expect("utf-8");
    let readme = std::fs::read_to_string(mlxcel_tests::root().join("README.md")).expect("README");
    let block = readme
        .split_once("<!-- settings: generated by `mlxcelctl config reference` -->\n")
        .and_then(|(_, rest)| rest.split_once("<!-- settings: end -->"))
        .map(|(block, _)| block)
        .expect("the README's settings block");
    assert!(
        block == reference,
        "the README's settings differ from the key table: paste `mlxcelctl config reference` \
         between its markers"
    );
    // Every process's --help carries its keys' text from the same table.
    for (process, flag, text) in [
        (
            "mlxcel-daemon",
            "--prefill-chunk",
            "Prompt tokens computed per engine step",
        ),
        (
            "mlxcel-frontend",
            "--max-queue",
            "Requests that may wait for their first token",
        ),
        (
            "mlxcel-cachemgr",
            "--idle-ttl",
            "Evict blocks unused for this long",
        ),
    ] {
        let out = Command::new(bin(process))
            .arg("--help")
            .output()
            .expect("--help");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            help.contains(flag) && help.contains(text),
            "{process}: {help}"
        );
    }
}
