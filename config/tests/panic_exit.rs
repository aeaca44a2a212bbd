//! A panic on any thread ends the process (so a supervisor restarts it), however the thread
//! was started: this test runs itself as a child process that panics on a side thread while
//! its main thread waits forever, and a tokio task that panics, whose panic the runtime would
//! otherwise catch.

use std::process::Command;

const ROLE: &str = "MLXCEL_PANIC_TEST_CHILD";

fn child(kind: &str) -> std::process::Output {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_panic_on_any_thread_ends_the_process",
            "--nocapture",
        ])
        .env(ROLE, kind)
        .output()
        .expect("run the child")
}

#[test]
fn a_panic_on_any_thread_ends_the_process() {
    match std::env::var(ROLE).as_deref() {
        Ok("thread") => {
            mlxcel_config::logging::init("panic-test", "info");
            std::thread::Builder::new()
                .name("engine".into())
                .spawn(|| panic!("boom in the engine"))
                .unwrap();
            loop {
                std::thread::park();
            }
        }
        Ok("task") => {
            mlxcel_config::logging::init("panic-test", "info");
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(async {
                let _ = tokio::spawn(async { panic!("boom in a task") }).await;
                std::future::pending::<()>().await;
            });
        }
        _ => {
            for kind in ["thread", "task"] {
                let out = child(kind);
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert_eq!(
                    out.status.code(),
                    Some(mlxcel_config::logging::PANIC_EXIT),
                    "{kind}: {stderr}"
                );
                assert!(
                    stderr.contains("boom in") && stderr.contains("exiting"),
                    "{kind}: {stderr}"
                );
            }
        }
    }
}
