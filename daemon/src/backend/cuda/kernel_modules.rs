//! Our CUDA kernels' compiled modules, kept across starts.
//!
//! MLX 0.32's CUDA backend compiles each custom kernel (`mlx_fast_cuda_kernel`: the few-row
//! matmul's variants, the table attention's) with NVRTC at its first use, in every process, and
//! never writes the result down: `CustomKernel::eval_gpu` asks for its module with
//! `use_disk_cache = false`. Each compile took ~1.4 s on an H100 host, about nine of them 12.5 s
//! of a 14.5 s warm-up with every other kernel cached
//! (`bench/results/2026-12-06-gpu-h100-warmup-9b37287/`). A module's constructor still reads
//! `<ptx dir>/<module>.ptx` (and its kernel names, `<module>.txt`) before it compiles, whatever
//! that flag says. So the daemon watches NVRTC (`nvrtc_tap` in `main.rs`, CUDA builds only) and
//! writes what it compiled for a custom kernel where and as MLX writes its own modules
//! ([`save`]); `jit_cache` then shares them between daemons like MLX's.

use std::ffi::CStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// MLX names a custom kernel's module `custom_kernel_<name><template args>_<source hash>`.
const CUSTOM_PREFIX: &str = "custom_kernel_";

/// The longest module name MLX keeps as one file name (a longer one is split into directories;
/// those are left to MLX's compiler).
const MOST_FILE_NAME: usize = 245;

/// Whether the module NVRTC compiles as `program` (`<module>.cu`) is a custom kernel's, which
/// MLX does not write down itself; its module name if so.
pub fn custom_module(program: &str) -> Option<&str> {
    let module = program.strip_suffix(".cu")?;
    (module.starts_with(CUSTOM_PREFIX) && module.len() <= MOST_FILE_NAME).then_some(module)
}

/// Where MLX looks for compiled modules: `$MLX_PTX_CACHE_DIR`, else `<temp dir>/mlx/<MLX
/// version>/ptx` (the temp dir is this daemon's own under `jit_cache`).
pub fn ptx_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("MLX_PTX_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    Some(
        std::env::temp_dir()
            .join("mlx")
            .join(mlx_version()?)
            .join("ptx"),
    )
}

fn mlx_version() -> Option<String> {
    // SAFETY: a new string, filled by mlx-c, read, then freed.
    unsafe {
        let mut s = mlx_sys::mlx_string_new();
        let version = (mlx_sys::mlx_version(&mut s) == 0)
            .then(|| {
                let data = mlx_sys::mlx_string_data(s);
                (!data.is_null()).then(|| CStr::from_ptr(data).to_string_lossy().into_owned())
            })
            .flatten();
        mlx_sys::mlx_string_free(s);
        version
    }
}

/// Writes `module`'s compiled code (`code`, PTX or cubin, as NVRTC gave it) and its kernels'
/// names (each kernel's name and its mangled name) into `dir` as MLX does: `<module>.txt`
/// first, then `<module>.ptx`, each whole (written aside, then renamed), so a reader finds
/// both or no module. Nothing is written where the module is already there. Says whether it
/// wrote it.
pub fn save(
    dir: &Path,
    module: &str,
    kernels: &[(String, String)],
    code: &[u8],
) -> io::Result<bool> {
    let ptx = dir.join(format!("{module}.ptx"));
    if code.is_empty() || kernels.is_empty() || ptx.exists() {
        return Ok(false);
    }
    fs::create_dir_all(dir)?;
    let names: String = kernels.iter().map(|(n, m)| format!("{n}\t{m}\n")).collect();
    whole(&dir.join(format!("{module}.txt")), names.as_bytes())?;
    whole(&ptx, code)?;
    Ok(true)
}

fn whole(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let aside = path.with_extension(format!("part-{}", std::process::id()));
    fs::write(&aside, bytes)?;
    fs::rename(&aside, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_custom_kernels_modules_of_one_file_name_are_kept() {
        let long = format!("custom_kernel_{}.cu", "x".repeat(300));
        assert_eq!(
            custom_module("custom_kernel_mlxcel_rows_float16_8_f_t_1a2b.cu"),
            Some("custom_kernel_mlxcel_rows_float16_8_f_t_1a2b")
        );
        assert_eq!(
            custom_module("binary_add_float16.cu"),
            None,
            "MLX writes its own"
        );
        assert_eq!(custom_module("custom_kernel_x"), None, "not a program name");
        assert_eq!(custom_module(&long), None, "split into directories by MLX");
    }

    #[test]
    fn a_module_is_written_as_mlx_reads_it_and_never_over_another() {
        let dir = std::env::temp_dir().join(format!("mlxcel-modules-{}", std::process::id()));
        let kernels = vec![(
            "mlx::core::cu::custom_kernel_k".to_string(),
            "_Z1kv".to_string(),
        )];
        assert!(save(&dir, "custom_kernel_k_1f", &kernels, b"\x7fELF cubin").expect("save"));
        assert_eq!(
            fs::read_to_string(dir.join("custom_kernel_k_1f.txt")).expect("names"),
            "mlx::core::cu::custom_kernel_k\t_Z1kv\n"
        );
        assert_eq!(
            fs::read(dir.join("custom_kernel_k_1f.ptx")).expect("code"),
            b"\x7fELF cubin"
        );
        assert!(!save(&dir, "custom_kernel_k_1f", &kernels, b"other").expect("again"));
        assert_eq!(
            fs::read(dir.join("custom_kernel_k_1f.ptx")).expect("code"),
            b"\x7fELF cubin"
        );
        assert!(!save(&dir, "custom_kernel_empty", &kernels, b"").expect("no code"));
        assert!(!dir.join("custom_kernel_empty.ptx").exists());
        let leftovers = fs::read_dir(&dir).expect("dir").flatten().count();
        assert_eq!(leftovers, 2, "no file written aside is left");
        fs::remove_dir_all(&dir).expect("clean up");
    }
}
