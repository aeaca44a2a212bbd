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
        "ipc", "config", "grammar", "cachemgr", "ctl", "daemon", "frontend", "tests",
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

/// The crates' maps: the file whose `//!` doc lists its modules.
const MAPS: [&str; 8] = [
    "ipc/src/lib.rs",
    "config/src/lib.rs",
    "grammar/src/lib.rs",
    "cachemgr/src/lib.rs",
    "daemon/src/lib.rs",
    "frontend/src/lib.rs",
    "ctl/src/main.rs",
    "tests/kit/lib.rs",
];

#[test]
fn every_module_is_named_in_its_crates_map() {
    let mut missing = Vec::new();
    for map in MAPS {
        let text = std::fs::read_to_string(root().join(map)).expect("map");
        let doc: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        let modules = text.lines().filter_map(|l| {
            let l = l.trim_start_matches("pub ");
            let name = l.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.to_string())
        });
        for m in modules {
            let named = doc.contains(&format!("[`{m}`]")) || doc.contains(&format!("`{m}`"));
            if !named {
                missing.push(format!("{map}: {m}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "modules missing from their crate's map: {missing:?}"
    );
}

/// Every `pub type NAME =` and `pub struct NAMEId` in the crates' sources, with where.
fn type_definitions() -> Vec<(String, String)> {
    let mut files = Vec::new();
    for krate in [
        "ipc", "config", "grammar", "cachemgr", "ctl", "daemon", "frontend",
    ] {
        rust_files(&root().join(krate).join("src"), &mut files);
    }
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("source");
        for line in text.lines().map(str::trim) {
            let name = if let Some(rest) = line.strip_prefix("pub type ") {
                rest.split([' ', '<', '=']).next()
            } else if let Some(rest) = line.strip_prefix("pub struct ") {
                rest.split([' ', '(', '<', '{', ';'])
                    .next()
                    .filter(|n| n.ends_with("Id"))
            } else {
                None
            };
            if let Some(name) = name.filter(|n| !n.is_empty()) {
                out.push((name.to_string(), f.display().to_string()));
            }
        }
    }
    out
}

#[test]
fn no_type_alias_or_id_type_is_defined_twice() {
    let defs = type_definitions();
    assert!(
        defs.iter().any(|(n, _)| n == "BlockId"),
        "the scan finds BlockId's definition"
    );
    let mut twice = Vec::new();
    for (i, (name, file)) in defs.iter().enumerate() {
        if let Some((_, other)) = defs[i + 1..].iter().find(|(n, _)| n == name) {
            twice.push(format!("{name}: {file} and {other}"));
        }
    }
    assert!(twice.is_empty(), "defined twice: {twice:?}");
}

#[test]
fn architectures_and_backends_import_nothing_from_the_engine_the_pool_or_the_server() {
    let forbidden = [
        "crate::engine",
        "crate::scheduler",
        "crate::runner",
        "crate::sequence",
        "crate::server",
        "crate::pool",
        "crate::paged",
        "crate::cache_client",
    ];
    let mut files = Vec::new();
    for dir in ["daemon/src/model", "daemon/src/backend"] {
        rust_files(&root().join(dir), &mut files);
    }
    assert!(files.len() > 10, "found only {} files", files.len());
    let mut offenders = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("source");
        for (n, line) in text.lines().enumerate() {
            if let Some(what) = forbidden.iter().find(|w| line.contains(*w)) {
                offenders.push(format!("{}:{}: {what}", f.display(), n + 1));
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:?}");
}

#[test]
fn no_mlxcel_variable_is_read_outside_the_configuration_and_the_test_kit() {
    let mut files = Vec::new();
    for krate in ["ipc", "grammar", "cachemgr", "ctl", "daemon", "frontend"] {
        rust_files(&root().join(krate), &mut files);
    }
    // A build script reads the build's own configuration (`MLXCEL_BACKEND`, which MLX the
    // binaries link), not a setting of a running process.
    files.retain(|f| !f.ends_with("build.rs"));
    let mut offenders = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("source");
        for (n, line) in text.lines().enumerate() {
            let reads = line.contains("env::var(\"MLXCEL_")
                || line.contains("env::var_os(\"MLXCEL_")
                || (line.contains("env::var") && line.contains("MLXCEL_"));
            if reads {
                offenders.push(format!("{}:{}", f.display(), n + 1));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "read outside config/ and tests/kit: {offenders:?}"
    );
}
