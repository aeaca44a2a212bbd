//! A layer's rotation from the model's RoPE settings: its frequencies (plain, linearly scaled or
//! YaRN) and what it does to the attention scores.

use super::config::RopeScaling;
use crate::backend::RopeSpec;

/// The rotation of `dims` dimensions at base `theta` under `scaling`, and the factor it
/// multiplies the attention scores by (YaRN scales q and k up, so scores by its square).
pub fn rotation(dims: i32, theta: f32, scaling: RopeScaling) -> (RopeSpec, f32) {
    let mut spec = RopeSpec::plain(dims, theta, false);
    match scaling {
        RopeScaling::None => (spec, 1.0),
        RopeScaling::Linear { factor } => {
            spec.scale = 1.0 / factor;
            (spec, 1.0)
        }
        RopeScaling::Yarn {
            factor,
            beta_fast,
            beta_slow,
            original,
            mscale,
            mscale_all_dim,
        } => {
            spec.freqs = Some(yarn_freqs(
                dims, theta, factor, beta_fast, beta_slow, original,
            ));
            let m = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim);
            (spec, m * m)
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original,
        } => {
            let original = original as f64;
            let (low, high) = (f64::from(low_freq_factor), f64::from(high_freq_factor));
            let freqs = (0..dims / 2).map(|i| {
                let plain = f64::from(theta).powf(-2.0 * f64::from(i) / f64::from(dims));
                let wavelen = 2.0 * std::f64::consts::PI / plain;
                let f = if wavelen < original / high {
                    plain
                } else if wavelen > original / low {
                    plain / f64::from(factor)
                } else {
                    let smooth = (original / wavelen - low) / (high - low);
                    plain * ((1.0 - smooth) / f64::from(factor) + smooth)
                };
                f as f32
            });
            spec.freqs = Some(freqs.collect());
            (spec, 1.0)
        }
    }
}

/// YaRN's frequencies as MLX's reference computes them (the ramp's ends rounded outwards, as
/// Hugging Face does with `truncate`): high frequencies kept, low ones divided by `factor`, a
/// linear ramp between the dimensions that turn `beta_fast` and `beta_slow` times over the
/// `original` context.
fn yarn_freqs(
    dims: i32,
    theta: f32,
    factor: f32,
    beta_fast: f32,
    beta_slow: f32,
    original: usize,
) -> Vec<f32> {
    let (d, b) = (f64::from(dims), f64::from(theta));
    let corr = |rotations: f64| {
        d * (original as f64 / (2.0 * std::f64::consts::PI * rotations)).ln() / (2.0 * b.ln())
    };
    let low = corr(f64::from(beta_fast)).floor().max(0.0);
    let mut high = corr(f64::from(beta_slow)).ceil().min(d - 1.0);
    if low == high {
        high += 0.001;
    }
    (0..dims / 2)
        .map(|i| {
            let ramp = ((f64::from(i) - low) / (high - low)).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            let plain = b.powf(-2.0 * f64::from(i) / d);
            (keep * plain + (1.0 - keep) * plain / f64::from(factor)) as f32
        })
        .collect()
}

fn yarn_mscale(factor: f32, m: f32) -> f32 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * m * factor.ln() + 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt_oss_yarn_matches_the_reference_figures() {
        // gpt-oss: head_dim 64, base 150000, factor 32 over 4096 positions, betas 32 and 1.
        let scaling = RopeScaling::Yarn {
            factor: 32.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original: 4096,
            mscale: 1.0,
            mscale_all_dim: 0.0,
        };
        let (spec, score) = rotation(64, 150_000.0, scaling);
        let f = spec.freqs.expect("freqs");
        assert_eq!(f.len(), 32);
        // Below the ramp (i < 8) frequencies are kept, above it (i ≥ 18) divided by 32.
        let plain = |i: i32| 150_000f64.powf(-2.0 * f64::from(i) / 64.0) as f32;
        assert!((f[3] - plain(3)).abs() < 1e-7);
        assert!((f[20] - plain(20) / 32.0).abs() < 1e-9);
        // mscale = 0.1 ln 32 + 1 = 1.3465736; scores by its square.
        assert!((score - 1.346_573_6f32.powi(2)).abs() < 1e-5);
    }

    #[test]
    fn llama3_scaling_keeps_high_frequencies_and_divides_low_ones() {
        // Llama 3.2: head_dim 64, base 500000, factor 32, wavelengths from 8192 / 4 to 8192.
        let scaling = RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original: 8192,
        };
        let (spec, score) = rotation(64, 500_000.0, scaling);
        let f = spec.freqs.expect("freqs");
        let plain = |i: i32| 500_000f64.powf(-2.0 * f64::from(i) / 64.0) as f32;
        assert_eq!((f[0], score), (plain(0), 1.0));
        assert!((f[31] - plain(31) / 32.0).abs() < 1e-12);
        // In between, a blend: below the plain frequency, above the divided one.
        let mid = (0..32).find(|&i| f[i] != plain(i as i32) && f[i] != plain(i as i32) / 32.0);
        let i = mid.expect("a blended frequency");
        assert!(f[i] < plain(i as i32) && f[i] > plain(i as i32) / 32.0);
    }

    #[test]
    fn linear_scaling_divides_positions() {
        let (spec, score) = rotation(16, 1e6, RopeScaling::Linear { factor: 8.0 });
        assert_eq!((spec.scale, score, spec.freqs), (0.125, 1.0, None));
    }
}
