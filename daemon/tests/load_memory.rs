//! Loading builds the model one layer at a time out of the file's tensors: what a load makes of
//! a layer (here, the joined projections of a GPU placement) replaces that layer's tensors, not
//! the whole file's. Measured with MLX's own counters (exact, not sampled), so this file holds
//! one test: the counters are the process's.

mod support;

use mlxcel_daemon::device::Placement;
use support::{HfDir, write_hf_dir};

#[test]
fn a_load_that_joins_projections_peaks_about_one_layer_above_what_it_keeps() {
    let dir = tempfile::tempdir().unwrap();
    write_hf_dir(dir.path(), HfDir::default());
    let placement = Placement::formulation_on_cpu(false);
    mlx_rs::memory::clear_cache().unwrap();
    let before = mlx_rs::memory::active_memory().unwrap();
    mlx_rs::memory::reset_peak_memory().unwrap();
    let loaded = mlxcel_daemon::load_placed(dir.path(), placement).expect("load");
    let peak = mlx_rs::memory::peak_memory().unwrap();
    let kept = mlx_rs::memory::active_memory().unwrap() - before;
    let c = &loaded.model.config;
    // One layer's joined projections (q, k, v, gate, up), f32: what joining that layer copies.
    let layer = 4 * c.hidden * (c.hidden + 2 * c.kv_heads * c.head_dim + 2 * c.ffn);
    let above = peak.saturating_sub(before + kept);
    eprintln!("load: keeps {kept} bytes, peaked {above} above; one layer joined: {layer}");
    assert!(kept > 400 << 20, "the f32 model is kept: {kept} bytes");
    assert!(
        above <= 3 * layer,
        "the load peaked {above} bytes above what it keeps ({kept}); one layer's joined \
         projections are {layer}"
    );
}
