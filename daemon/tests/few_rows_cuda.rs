//! The few-row CUDA matmul (`backend::cuda::few_rows`) gives what f32 products summed in f32
//! give, for both dtypes it takes, row counts across its tiles, weights whose rows are not a
//! multiple of a tile's and whose width is not a multiple of a block's pass, and inputs not
//! 16-byte aligned; with its epilogues, what adding the residual or SwiGLU after that product
//! give.
//! Needs a CUDA GPU: without one each test says it was skipped (CI has none;
//! `scripts/gpu_check.sh` runs them on one).

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype, ops, random};
use mlxcel_daemon::backend::Epilogue;
use mlxcel_daemon::backend::cuda::few_rows::{CudaSkinny, MAX_ROWS};
use mlxcel_daemon::device::{DeviceChoice, DeviceKind, Placement};

fn on_cuda() -> Option<Placement> {
    let placement = Placement::choose(DeviceChoice::Auto).expect("a device");
    if placement.kind == DeviceKind::Cuda {
        return Some(placement);
    }
    eprintln!(
        "skipped: no CUDA GPU here (device {}), nothing checked",
        placement.kind
    );
    None
}

fn normal(shape: &[i32], dtype: Dtype, scale: f32) -> Array {
    let a = random::normal::<f32>(shape, None, None, None).unwrap();
    ops::multiply(&a, Array::from_f32(scale))
        .unwrap()
        .as_dtype(dtype)
        .unwrap()
}

/// Largest |a - b| over |b|'s largest, both read as f32.
fn relative_error(a: &Array, b: &Array) -> f32 {
    let (a, b) = (
        a.as_dtype(Dtype::Float32).unwrap(),
        b.as_dtype(Dtype::Float32).unwrap(),
    );
    let diff = ops::abs(ops::subtract(&a, &b).unwrap())
        .unwrap()
        .max(None)
        .unwrap();
    let size = ops::abs(&b).unwrap().max(None).unwrap();
    diff.item_cast::<f32>() / size.item_cast::<f32>().max(1e-6)
}

/// `x · wᵀ` as f32 products summed in f32 (CUDA's f32 matmul may run as TF32): `x` is
/// `[..., in]`, `w` `[out, in]`.
fn reference(x: &Array, w: &Array) -> Array {
    let f32 = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
    let products = ops::multiply(ops::expand_dims(f32(x), -2).unwrap(), f32(w)).unwrap();
    ops::sum_axis(&products, -1, None).unwrap()
}

#[test]
fn the_kernel_matches_an_f32_matmul_for_each_dtype_row_count_and_odd_shape() {
    let Some(_) = on_cuda() else { return };
    // (out, in): a projection's shape; outputs not a multiple of a 16-row tile, inputs not a
    // multiple of the block's 256 per pass.
    let shapes = [(1024, 4096), (1000, 520), (72, 104)];
    for dtype in [Dtype::Float16, Dtype::Bfloat16] {
        let tolerance = if dtype == Dtype::Float16 { 5e-3 } else { 2e-2 };
        for (out, inner) in shapes {
            let w = normal(&[out, inner], dtype, 1.0 / (inner as f32).sqrt());
            w.eval().unwrap();
            let kernel = CudaSkinny::new(&w).expect("the kernel takes a row-major float weight");
            for rows in [2, 3, 5, 8, 9, 16] {
                // A decode step's activations: `[rows, 1, in]`.
                let x = normal(&[rows, 1, inner], dtype, 1.0);
                let y = kernel
                    .forward(&x)
                    .unwrap()
                    .expect("2..=16 rows are the kernel's");
                let want = reference(&x, &w);
                assert_eq!(y.shape(), &[rows, 1, out]);
                assert_eq!(y.dtype(), dtype);
                let err = relative_error(&y, &want);
                eprintln!("{dtype:?} [{rows}, {inner}] x [{out}, {inner}]ᵀ: relative error {err}");
                assert!(
                    err < tolerance,
                    "{dtype:?} [{rows}, {inner}] x [{out}, {inner}]ᵀ: relative error {err}"
                );
            }
        }
    }
}

#[test]
fn inputs_that_are_not_16_byte_aligned_are_read_too() {
    let Some(_) = on_cuda() else { return };
    let (rows, out, inner) = (5, 48, 64);
    let w = normal(&[out, inner], Dtype::Float16, 0.1);
    w.eval().unwrap();
    let kernel = CudaSkinny::new(&w).expect("taken");
    // A row-major view 3 elements (6 bytes) into its buffer.
    let flat = normal(&[rows * inner + 3], Dtype::Float16, 1.0);
    let x = flat.index(3..).reshape(&[rows, inner]).unwrap();
    let y = kernel.forward(&x).unwrap().expect("taken");
    let err = relative_error(&y, &reference(&x, &w));
    assert!(err < 5e-3, "relative error {err}");
}

#[test]
fn one_row_too_many_rows_or_another_dtype_stay_with_mlx() {
    let Some(_) = on_cuda() else { return };
    let w = normal(&[64, 128], Dtype::Float16, 0.1);
    w.eval().unwrap();
    let kernel = CudaSkinny::new(&w).expect("taken");
    for x in [
        normal(&[1, 128], Dtype::Float16, 1.0),
        normal(&[MAX_ROWS + 1, 128], Dtype::Float16, 1.0),
        normal(&[4, 128], Dtype::Float32, 1.0),
        normal(&[4, 64], Dtype::Float16, 1.0),
    ] {
        assert!(
            kernel.forward(&x).unwrap().is_none(),
            "{:?} {:?}",
            x.shape(),
            x.dtype()
        );
    }
    // Not taken: a transposed (not row-major) weight, which would be copied on every call; f32;
    // an input width that is not whole 16-byte loads.
    let wt = normal(&[128, 64], Dtype::Float16, 0.1);
    let w32 = normal(&[64, 128], Dtype::Float32, 0.1);
    let odd = normal(&[64, 100], Dtype::Float16, 0.1);
    mlx_rs::transforms::eval([&wt, &w32, &odd]).unwrap();
    assert!(CudaSkinny::new(&wt.t()).is_none());
    assert!(CudaSkinny::new(&w32).is_none());
    assert!(CudaSkinny::new(&odd).is_none());
}

/// `silu(gate) * up` of `y` = `[..., 2n]` (gate first), in f32.
fn swiglu(y: &Array) -> Array {
    let n = y.shape()[y.ndim() - 1] / 2;
    let (g, u) = (y.index((.., .., ..n)), y.index((.., .., n..)));
    let silu = ops::multiply(&g, ops::sigmoid(&g).unwrap()).unwrap();
    ops::multiply(&silu, &u).unwrap()
}

#[test]
fn the_epilogues_add_the_residual_and_apply_swiglu() {
    let Some(_) = on_cuda() else { return };
    // (out, in): a down projection's and a joined gate/up's shapes, then outputs that are not a
    // multiple of a tile (1000 pairs: not a multiple of 8 either).
    let shapes = [(1024, 4096), (2048, 520), (2000, 104)];
    for dtype in [Dtype::Float16, Dtype::Bfloat16] {
        let tolerance = if dtype == Dtype::Float16 { 5e-3 } else { 2e-2 };
        for (out, inner) in shapes {
            let w = normal(&[out, inner], dtype, 1.0 / (inner as f32).sqrt());
            w.eval().unwrap();
            let kernel = CudaSkinny::new(&w).expect("taken");
            for rows in [2, 5, 8, 9, 16] {
                let x = normal(&[rows, 1, inner], dtype, 1.0);
                let r = normal(&[rows, 1, out], dtype, 1.0);
                let product = reference(&x, &w);
                let added = kernel
                    .forward_with(&x, &Epilogue::Add(&r))
                    .unwrap()
                    .expect("a residual of the output's shape is taken");
                let want = ops::add(&product, r.as_dtype(Dtype::Float32).unwrap()).unwrap();
                assert_eq!(added.shape(), &[rows, 1, out]);
                let err = relative_error(&added, &want);
                assert!(
                    err < tolerance,
                    "{dtype:?} add, {rows} rows, {out}x{inner}: {err}"
                );
                let glu = kernel
                    .forward_with(&x, &Epilogue::SwiGlu)
                    .unwrap()
                    .expect("an even weight row count is taken");
                assert_eq!(glu.shape(), &[rows, 1, out / 2]);
                assert_eq!(glu.dtype(), dtype);
                let err = relative_error(&glu, &swiglu(&product));
                eprintln!("{dtype:?} {rows} rows, {out}x{inner}: swiglu relative error {err}");
                assert!(
                    err < tolerance,
                    "{dtype:?} swiglu, {rows} rows, {out}x{inner}: {err}"
                );
            }
        }
    }
    // Not taken: a residual of another shape or dtype, an odd weight row count for SwiGLU.
    let w = normal(&[63, 64], Dtype::Float16, 0.1);
    w.eval().unwrap();
    let kernel = CudaSkinny::new(&w).expect("taken");
    let x = normal(&[4, 64], Dtype::Float16, 1.0);
    for r in [
        normal(&[4, 62], Dtype::Float16, 1.0),
        normal(&[4, 63], Dtype::Float32, 1.0),
    ] {
        assert!(
            kernel
                .forward_with(&x, &Epilogue::Add(&r))
                .unwrap()
                .is_none()
        );
    }
    assert!(
        kernel
            .forward_with(&x, &Epilogue::SwiGlu)
            .unwrap()
            .is_none()
    );
}
