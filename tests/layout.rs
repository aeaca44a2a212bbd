//! The layout of the design card: every test file here is a listed target (cargo finds no test
//! here by itself), and no crate reaches into another's test files with `#[path]` includes.

use std::path::Path;

use mlxcel_tests::root;

#[test]
fn every_test_file_here_is_a_target_in_the_manifest() {
    let manifest = std::fs::read_to_string(root().join("tests/Cargo.toml")).expect("manifest");
    let listed: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.strip_prefix("path = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root().join("tests")).expect("tests/") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if name.ends_with(".rs") && !listed.contains(&name.as_str()) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "add a [[test]] for each of {missing:?} to tests/Cargo.toml, or cargo never runs it"
    );
    assert!(listed.len() >= 20, "only {} targets listed", listed.len());
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_crate_includes_another_crates_test_files() {
    let mut files = Vec::new();
    for krate in [
        "ipc", "config", "cachemgr", "ctl", "daemon", "frontend", "tests",
    ] {
        rust_files(&root().join(krate), &mut files);
    }
    assert!(files.len() > 50, "found only {} Rust files", files.len());
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| {
            std::fs::read_to_string(f)
                .is_ok_and(|text| text.lines().any(|l| l.starts_with("#[path = \"../")))
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "use the shared kit (mlxcel_tests) instead of #[path] includes: {offenders:?}"
    );
}
