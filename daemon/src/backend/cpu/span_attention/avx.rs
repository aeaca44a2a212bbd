//! The span kernel's inner loops in AVX2 + FMA: a tile's scores, and folding a tile into one
//! query vector's running softmax and output.

use std::arch::x86_64::*;

use super::KT;

/// Query vectors per pass of [`scores`]: 4 vectors × 2 keys = 8 accumulators, and each load of
/// a key feeds four FMAs.
const QR: usize = 4;

/// `s[j][i] = qv_j · k_i` for the `kt` keys at `kp` (rows of `hd`) and every query vector of
/// `qv` (rows of `hd`, one per entry of `s`).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scores(qv: &[f32], hd: usize, kp: *const f32, kt: usize, s: &mut [[f32; KT]]) {
    let nq = s.len();
    let mut j = 0;
    while j < nq {
        let take = (nq - j).min(QR);
        let q = &qv[j * hd..(j + take) * hd];
        let mut i = 0;
        while i < kt {
            let keys = (kt - i).min(2);
            // SAFETY: keys `i..i + keys` are rows of the tile; `q` holds `take` rows.
            let d = unsafe { dots(q, take, kp.add(i * hd), keys, hd) };
            for (a, row) in d.iter().enumerate().take(take) {
                for (c, v) in row.iter().enumerate().take(keys) {
                    s[j + a][i + c] = *v;
                }
            }
            i += keys;
        }
        j += take;
    }
}

/// Up to [`QR`] query vectors against up to two keys: `out[a][c] = q_a · k_c`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)] // register arrays, indexed by constants once unrolled
unsafe fn dots(q: &[f32], take: usize, k: *const f32, keys: usize, hd: usize) -> [[f32; 2]; QR] {
    let qp = q.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); 2]; QR];
    let mut d = 0;
    while d < hd {
        // SAFETY: `d < hd`, a multiple of 8: lanes `d..d + 8` of each row exist.
        unsafe {
            let k0 = _mm256_loadu_ps(k.add(d));
            let k1 = if keys > 1 {
                _mm256_loadu_ps(k.add(hd + d))
            } else {
                _mm256_setzero_ps()
            };
            for a in 0..QR {
                if a < take {
                    let x = _mm256_loadu_ps(qp.add(a * hd + d));
                    acc[a][0] = _mm256_fmadd_ps(x, k0, acc[a][0]);
                    acc[a][1] = _mm256_fmadd_ps(x, k1, acc[a][1]);
                }
            }
        }
        d += 8;
    }
    let mut out = [[0f32; 2]; QR];
    for a in 0..take {
        for c in 0..2 {
            out[a][c] = hsum(acc[a][c]);
        }
    }
    out
}

/// Folds the first `e` scores of a tile (base 2) into a query vector's running maximum and sum
/// (`state`) and its unnormalised output `acc` (`hd` floats), with the tile's values at `vp`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn absorb(
    s: &mut [f32; KT],
    e: usize,
    state: &mut (f32, f32),
    acc: &mut [f32],
    vp: *const f32,
    hd: usize,
) {
    let (m, l) = *state;
    let top = s[..e].iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let m_new = m.max(top);
    let corr = if m == f32::NEG_INFINITY {
        0.0
    } else {
        (m - m_new).exp2()
    };
    let mut p = [0f32; KT];
    let mut c = 0;
    while c < KT {
        // SAFETY: `c + 8 <= KT` (a multiple of 8).
        unsafe {
            let x = _mm256_sub_ps(_mm256_loadu_ps(s.as_ptr().add(c)), _mm256_set1_ps(m_new));
            _mm256_storeu_ps(p.as_mut_ptr().add(c), exp2(x));
        }
        c += 8;
    }
    p[e..].iter_mut().for_each(|x| *x = 0.0);
    *state = (m_new, l * corr + p[..e].iter().sum::<f32>());
    let mut d = 0;
    while d < hd {
        let w = (hd - d).min(64);
        // SAFETY: lanes `d..d + w` of `acc` and of each of the `e` value rows exist.
        unsafe { weigh(&mut acc[d..d + w], corr, &p[..e], vp.add(d), hd) };
        d += w;
    }
}

/// `acc = acc · corr + Σ_i p_i · v_i` over up to 64 lanes of `acc` (a multiple of 8), `v_i` the
/// rows at `vp`, `hd` apart.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn weigh(acc: &mut [f32], corr: f32, p: &[f32], vp: *const f32, hd: usize) {
    let n = acc.len() / 8;
    let ap = acc.as_mut_ptr();
    let mut r = [_mm256_setzero_ps(); 8];
    // SAFETY: `n` chunks of 8 lanes of `acc` and of each value row exist.
    unsafe {
        let cv = _mm256_set1_ps(corr);
        for c in 0..8 {
            if c < n {
                r[c] = _mm256_mul_ps(_mm256_loadu_ps(ap.add(8 * c)), cv);
            }
        }
        for (i, &pi) in p.iter().enumerate() {
            let w = _mm256_set1_ps(pi);
            let row = vp.add(i * hd);
            for c in 0..8 {
                if c < n {
                    r[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(row.add(8 * c)), r[c]);
                }
            }
        }
        for c in 0..8 {
            if c < n {
                _mm256_storeu_ps(ap.add(8 * c), r[c]);
            }
        }
    }
}

/// `2^x` per lane, as `fast_exp` builds it: `2^round(x) · P(f)`, `P` the degree-6 Taylor
/// series on `|f| ≤ 1/2`, inputs clamped to ±126 (so `-inf` gives ~1e-38).
#[target_feature(enable = "avx2,fma")]
unsafe fn exp2(x: __m256) -> __m256 {
    let c = super::super::fast_exp::C;
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-126.0)),
        _mm256_set1_ps(126.0),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm256_sub_ps(x, n);
    let mut y = _mm256_set1_ps(c[6]);
    for k in (0..6).rev() {
        y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(c[k]));
    }
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(y, _mm256_castsi256_ps(bits))
}

/// The sum of a register's lanes.
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0x55>(s, s));
    _mm_cvtss_f32(s)
}
