//! Unusable model files get a clear error naming the file and the problem, never a panic.

use std::path::Path;

use mlxcel_daemon::load;

fn err_of(path: &Path) -> String {
    match load(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_missing_file_is_named() {
    let e = err_of(Path::new("/nonexistent/model.gguf"));
    assert!(
        e.contains("/nonexistent/model.gguf") && e.contains("no such file"),
        "{e}"
    );
}

#[test]
fn a_truncated_or_garbage_gguf_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let real =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let bytes = std::fs::read(&real).expect("run `make setup` for the default model");
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    let e = err_of(&truncated);
    assert!(e.contains("truncated.gguf"), "{e}");
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"this is not a gguf file at all").unwrap();
    let e = err_of(&garbage);
    assert!(e.contains("garbage.gguf") && e.contains("GGUF"), "{e}");
}

#[test]
fn an_unknown_architecture_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("neox.gguf");
    let mut f = mlx_rs::io::GgufFile::new().unwrap();
    f.insert_metadata("general.architecture", "gptneox")
        .unwrap();
    f.insert_array(
        "token_embd.weight",
        &mlx_rs::Array::from_slice(&[0f32; 4], &[2, 2]),
    )
    .unwrap();
    f.save(&path).unwrap();
    let e = err_of(&path);
    assert!(
        e.contains("neox.gguf") && e.contains("unsupported architecture `gptneox`"),
        "{e}"
    );
}

#[test]
fn other_files_are_refused_with_the_reason() {
    let e = err_of(Path::new("/etc/hostname"));
    assert!(
        e.contains("/etc/hostname") && e.contains("not a .gguf file"),
        "{e}"
    );
}
