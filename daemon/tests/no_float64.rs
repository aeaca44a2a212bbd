//! No float64 ever reaches an MLX op: neither Metal nor CUDA has float64, and one cast to f64
//! while reading GGUF metadata (`"float64 is not supported on the GPU"`) once stopped every GPU
//! from loading the default model. The CPU backend accepts float64, so two checks stand in for
//! a GPU here: metadata of every stored width is read exactly on the host, and no engine source
//! asks MLX for a float64 array. On a machine with a GPU the golden and end-to-end tests load
//! the default model on it, which is the direct check.

use std::path::{Path, PathBuf};

use mlx_rs::Array;
use mlx_rs::io::GgufFile;
use mlxcel_daemon::model::gguf;

/// A minimal llama GGUF whose numeric metadata use the given dtypes, one per key.
fn gguf_with_numbers(path: &Path, numbers: &[(&str, Array)]) {
    let mut f = GgufFile::new().unwrap();
    f.insert_metadata("general.architecture", "llama").unwrap();
    for (k, a) in numbers {
        f.insert_metadata(*k, a.clone()).unwrap();
    }
    let tokens: Vec<String> = (0..8).map(|i| format!("t{i}")).collect();
    f.insert_metadata("tokenizer.ggml.model", "gpt2").unwrap();
    f.insert_metadata("tokenizer.ggml.tokens", tokens).unwrap();
    f.insert_array(
        "token_embd.weight",
        &Array::from_slice(&[0f32; 16], &[8, 2]),
    )
    .unwrap();
    f.save(path).unwrap();
}

#[test]
fn numeric_metadata_of_every_stored_width_is_read_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("widths.gguf");
    gguf_with_numbers(
        &path,
        &[
            ("llama.embedding_length", Array::from_slice(&[576u32], &[])),
            ("llama.attention.head_count", Array::from_slice(&[9u8], &[])),
            (
                "llama.attention.head_count_kv",
                Array::from_slice(&[3i16], &[]),
            ),
            ("llama.block_count", Array::from_slice(&[30u16], &[])),
            (
                "llama.feed_forward_length",
                Array::from_slice(&[1536i64], &[]),
            ),
            ("llama.context_length", Array::from_slice(&[8192u64], &[])),
            (
                "llama.attention.key_length",
                Array::from_slice(&[64i8], &[]),
            ),
            (
                "llama.rope.freq_base",
                Array::from_slice(&[100_000f32], &[]),
            ),
            (
                "tokenizer.ggml.bos_token_id",
                Array::from_slice(&[1i32], &[]),
            ),
            (
                "tokenizer.ggml.add_bos_token",
                Array::from_slice(&[true], &[]),
            ),
        ],
    );
    let m = gguf::load(&path).expect("a well-formed file loads");
    let c = &m.config;
    assert_eq!(
        (
            c.hidden,
            c.heads,
            c.kv_heads,
            c.layers,
            c.ffn,
            c.context_length,
            c.head_dim
        ),
        (576, 9, 3, 30, 1536, 8192, 64)
    );
    assert_eq!(c.rope_theta, 100_000.0);
    assert_eq!(m.vocab.bos, Some(1));
    assert!(m.vocab.add_bos);
}

#[test]
fn a_metadata_array_where_a_number_belongs_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("array.gguf");
    gguf_with_numbers(
        &path,
        &[(
            "llama.embedding_length",
            Array::from_slice(&[1u32, 2], &[2]),
        )],
    );
    let e = gguf::load(&path).err().expect("refused").to_string();
    assert!(
        e.contains("array.gguf")
            && e.contains("llama.embedding_length")
            && e.contains("single number"),
        "{e}"
    );
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_engine_source_asks_mlx_for_float64() {
    // Ways to make MLX produce a float64 array: a cast, a typed conversion, or the dtype itself.
    // Host-side f64 arithmetic (the sampler's sums) is fine and does not match these.
    let forbidden = [
        "_cast::<f64>",
        "as_type::<f64>",
        "Dtype::Float64)",
        "Dtype::Float64,",
        "from_slice(&[0f64",
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "benches"] {
        sources(&root.join(dir), &mut files);
    }
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            // Matching on a stored dtype (to read it on the host) is allowed; making one is not.
            if code.contains("=>") && code.contains("Dtype::Float64") {
                continue;
            }
            if let Some(p) = forbidden.iter().find(|p| code.contains(*p)) {
                found.push(format!(
                    "{}:{}: `{p}` in {}",
                    f.display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(files.len() > 20, "the engine's sources were not found");
    assert!(
        found.is_empty(),
        "float64 requested from MLX:\n{}",
        found.join("\n")
    );
}
