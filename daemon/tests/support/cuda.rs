//! Support for the CUDA kernels' tests: whether this machine runs them, random inputs, and the
//! attention they are checked against.

use mlx_rs::{Array, Dtype, ops, random};
use mlxcel_daemon::device::{DeviceChoice, DeviceKind, Placement};

/// Whether MLX's default device here is a CUDA GPU; says the test was skipped when not.
pub fn on_cuda() -> bool {
    let placement = Placement::choose(DeviceChoice::Auto).expect("a device");
    if placement.kind == DeviceKind::Cuda {
        return true;
    }
    eprintln!(
        "skipped: no CUDA GPU here (device {}), nothing checked",
        placement.kind
    );
    false
}

/// Standard normal values of `shape` in `dtype`.
pub fn normal(shape: &[i32], dtype: Dtype) -> Array {
    random::normal::<f32>(shape, None, None, None)
        .unwrap()
        .as_dtype(dtype)
        .unwrap()
}

/// `a` in f32.
pub fn f32(a: &Array) -> Array {
    a.as_dtype(Dtype::Float32).unwrap()
}

/// One row's attention, f32: queries `[heads, d]` over keys and values `[kvh, n, d]`.
pub fn reference(q: &Array, k: &Array, v: &Array, group: i32) -> Array {
    let (heads, d) = (q.shape()[0], q.shape()[1]);
    let kvh = heads / group;
    let q = ops::multiply(f32(q), Array::from_f32(1.0 / (d as f32).sqrt())).unwrap();
    let q = q.reshape(&[kvh, group, d]).unwrap();
    let scores = ops::matmul(&q, f32(k).swap_axes(1, 2).unwrap()).unwrap();
    let p = ops::softmax_axis(&scores, -1, None).unwrap();
    ops::matmul(&p, f32(v))
        .unwrap()
        .reshape(&[heads * d])
        .unwrap()
}

/// The largest absolute difference between `got` (any dtype) and `want`.
pub fn max_error(got: &Array, want: &Array) -> f32 {
    ops::abs(ops::subtract(f32(got), want).unwrap())
        .unwrap()
        .max(None)
        .unwrap()
        .item_cast::<f32>()
}

/// What an attention kernel may differ from [`reference`] by in `dtype`. f32: the reference's
/// matmuls may run in TF32 on the GPU (measured 1.5e-4 on an H100).
pub fn tolerance(dtype: Dtype) -> f32 {
    if dtype == Dtype::Float32 { 1e-3 } else { 1e-2 }
}
