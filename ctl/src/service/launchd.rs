//! launchd agents (macOS): one property list per service, managed with `launchctl bootstrap
//! gui/$UID`, `bootout` and `kickstart -k`.

use std::path::{Path, PathBuf};

use plist::{Dictionary, Value};

use super::{Priority, ServiceSpec};

/// `~/Library/LaunchAgents/<label>.plist`.
pub fn plist_path(home: &Path, spec: &ServiceSpec) -> PathBuf {
    home.join("Library/LaunchAgents")
        .join(format!("{}.plist", spec.label))
}

/// The agent's property list as XML.
pub fn plist(spec: &ServiceSpec) -> Result<String, plist::Error> {
    let mut d = Dictionary::new();
    d.insert("Label".into(), spec.label.clone().into());
    let mut argv = vec![Value::from(spec.program.to_string_lossy().into_owned())];
    argv.extend(spec.args.iter().map(|a| Value::from(a.clone())));
    d.insert("ProgramArguments".into(), Value::Array(argv));
    if !spec.env.is_empty() {
        let env: Dictionary = spec
            .env
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.clone())))
            .collect();
        d.insert("EnvironmentVariables".into(), Value::Dictionary(env));
    }
    d.insert("RunAtLoad".into(), true.into());
    // Restart after a crash or a failure exit, not after a clean stop.
    let mut keep_alive = Dictionary::new();
    keep_alive.insert("SuccessfulExit".into(), (!spec.restart_on_failure).into());
    d.insert("KeepAlive".into(), Value::Dictionary(keep_alive));
    let process_type = match spec.priority {
        Priority::Standard => "Standard",
        Priority::Interactive => "Interactive",
    };
    d.insert("ProcessType".into(), process_type.into());
    d.insert(
        "ThrottleInterval".into(),
        Value::Integer(spec.throttle.as_secs().into()),
    );
    d.insert(
        "ExitTimeOut".into(),
        Value::Integer(spec.stop_timeout.as_secs().into()),
    );
    d.insert(
        "StandardOutPath".into(),
        spec.stdout_log.to_string_lossy().into_owned().into(),
    );
    d.insert(
        "StandardErrorPath".into(),
        spec.stderr_log.to_string_lossy().into_owned().into(),
    );
    let mut out = Vec::new();
    Value::Dictionary(d).to_writer_xml(&mut out)?;
    out.push(b'\n');
    Ok(String::from_utf8_lossy(&out).into_owned())
}
