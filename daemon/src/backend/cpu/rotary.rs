//! Rotary position embedding for MLX's CPU backend, where `fast::rope` has no kernel and falls
//! back to ~20 graph nodes per call (two calls per layer). Here the angles are computed once
//! per forward pass, on the host in f64 (positions are known there), and each call is
//! `x · cos + (x · R) · sin`: one small matmul by the signed permutation `R` that pairs each
//! dimension with its partner, and three elementwise ops.
//!
//! The GPU keeps MLX's fused kernel.

use std::rc::Rc;

use mlx_rs::{Array, ops};

use super::super::{RopeSpec, Rotate};
use crate::Result;

/// The rotation of one model: its frequencies, pairing and permutation.
pub struct Rotary {
    spec: RopeSpec,
    /// `theta^(-2i / head_dim)` for each pair `i`.
    inv_freq: Vec<f64>,
    /// Pairs are adjacent dimensions (`2i`, `2i + 1`) rather than halves (`i`, `i + d/2`).
    traditional: bool,
    /// `[head_dim, head_dim]`: `(x · R)[a] = -x[b]` and `(x · R)[b] = x[a]` for each pair (a, b).
    rotate: Array,
}

/// Cosines and sines of one forward pass, shaped to broadcast over `[b, heads, t, head_dim]`.
pub struct Angles {
    cos: Array,
    sin: Array,
}

impl Rotary {
    pub fn new(spec: RopeSpec) -> Rotary {
        let (head_dim, theta, traditional) = (spec.dims as usize, spec.theta, spec.traditional);
        let half = head_dim / 2;
        let inv_freq = match &spec.freqs {
            Some(f) => f.iter().map(|&x| f64::from(x)).collect(),
            None => (0..half)
                .map(|i| f64::from(theta).powf(-2.0 * i as f64 / head_dim as f64))
                .collect(),
        };
        let mut r = vec![0f32; head_dim * head_dim];
        for i in 0..half {
            let (a, b) = pair(i, half, traditional);
            r[b * head_dim + a] = -1.0; // out[a] = -x[b]
            r[a * head_dim + b] = 1.0; // out[b] = x[a]
        }
        let d = head_dim as i32;
        Rotary {
            spec,
            inv_freq,
            traditional,
            rotate: Array::from_slice(&r, &[d, d]),
        }
    }

    /// What it rotates by.
    pub fn spec(&self) -> &RopeSpec {
        &self.spec
    }

    /// Angles of positions `start..start + t` of one sequence: `[1, 1, t, head_dim]`.
    pub fn span(&self, start: i32, t: i32) -> Angles {
        let positions: Vec<i32> = (start..start + t).collect();
        self.angles(&positions, &[1, 1, t])
    }

    /// Angles of one position per row of a batch: `[b, 1, 1, head_dim]`.
    pub fn rows(&self, positions: &[i32]) -> Angles {
        self.angles(positions, &[positions.len() as i32, 1, 1])
    }

    fn angles(&self, positions: &[i32], lead: &[i32]) -> Angles {
        let half = self.inv_freq.len();
        let d = 2 * half;
        let (mut cos, mut sin) = (
            vec![0f32; positions.len() * d],
            vec![0f32; positions.len() * d],
        );
        let scale = f64::from(self.spec.scale);
        for (p, &pos) in positions.iter().enumerate() {
            for (i, f) in self.inv_freq.iter().enumerate() {
                let (sin_a, cos_a) = (f64::from(pos) * scale * f).sin_cos();
                let (a, b) = pair(i, half, self.traditional);
                for j in [a, b] {
                    cos[p * d + j] = cos_a as f32;
                    sin[p * d + j] = sin_a as f32;
                }
            }
        }
        let shape: Vec<i32> = lead.iter().copied().chain([d as i32]).collect();
        Angles {
            cos: Array::from_slice(&cos, &shape),
            sin: Array::from_slice(&sin, &shape),
        }
    }

    /// `x` (`[b, heads, t, head_dim]`) rotated by `angles`.
    pub fn apply(&self, x: &Array, angles: &Angles) -> Result<Array> {
        let turned = ops::matmul(x, &self.rotate)?;
        Ok(ops::add(
            &ops::multiply(x, &angles.cos)?,
            &ops::multiply(&turned, &angles.sin)?,
        )?)
    }
}

/// One pass's rotation: a [`Rotary`] at its angles.
pub struct Turn {
    pub rotary: Rc<Rotary>,
    pub angles: Angles,
}

impl Rotate for Turn {
    fn apply(&self, x: &Array) -> Result<Array> {
        self.rotary.apply(x, &self.angles)
    }
}

/// The two dimensions of pair `i`.
fn pair(i: usize, half: usize, traditional: bool) -> (usize, usize) {
    if traditional {
        (2 * i, 2 * i + 1)
    } else {
        (i, i + half)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::fast;

    fn close(a: &Array, b: &Array) -> f32 {
        let d = ops::abs(ops::subtract(a, b).expect("sub")).expect("abs");
        d.max(None).expect("max").item_exact::<f32>()
    }

    #[test]
    fn matches_mlx_rope_for_spans_and_rows_in_both_layouts() {
        let x = mlx_rs::random::normal::<f32>(&[2, 3, 5, 8], None, None, None).expect("x");
        for traditional in [false, true] {
            let rot = Rotary::new(RopeSpec::plain(8, 10_000.0, traditional));
            let ours = rot.apply(&x, &rot.span(7, 5)).expect("ours");
            let theirs = fast::rope(&x, 8, traditional, 10_000.0, 1.0, 7, None).expect("mlx rope");
            assert!(
                close(&ours, &theirs) < 1e-4,
                "span, traditional {traditional}"
            );
            // One position per row of a batch of decode steps.
            let x1 = mlx_rs::random::normal::<f32>(&[3, 4, 1, 8], None, None, None).expect("x");
            let pos = [0, 9, 1000];
            let ours = rot.apply(&x1, &rot.rows(&pos)).expect("ours");
            let offsets = Array::from_slice(&pos, &[3]);
            let theirs = fast::rope_dynamic(&x1, 8, traditional, 10_000.0, 1.0, &offsets, None)
                .expect("mlx rope");
            assert!(
                close(&ours, &theirs) < 1e-3,
                "rows, traditional {traditional}"
            );
        }
    }
}
