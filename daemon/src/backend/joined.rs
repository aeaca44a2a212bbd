//! Projections that read the same input, joined into one weight at load: q, k and v, and the
//! MLP's gate and up. One matmul of the joined weight does the work of three (or two) with one
//! op, and its output is cut back into the parts by views. On a GPU every matmul is a kernel
//! (at more than one row, a cuBLAS call) that the host prepares for each layer of each step,
//! and a decode step there is host-bound; on the CPU each op is a graph node, and the few-row
//! kernel reads one weight in one pass.

use mlx_rs::{Array, ops};

use super::{Backend, Linear};
use crate::Result;

/// Linear layers over one input, as loaded (`Apart`) or joined along their outputs.
pub enum Joined {
    Apart(Vec<Linear>),
    /// One layer whose output is the parts' outputs side by side, cut apart at `cuts`.
    One {
        linear: Linear,
        cuts: Vec<i32>,
    },
}

impl Joined {
    /// `parts`, joined where they can be: all dense, or all quantized alike, with biases on all
    /// or none.
    pub fn new(parts: Vec<Linear>, backend: &dyn Backend) -> Result<Joined> {
        if parts.len() < 2 {
            return Ok(Joined::Apart(parts));
        }
        let cuts: Vec<i32> = parts[..parts.len() - 1]
            .iter()
            .scan(0, |at, p| {
                *at += p.out_features();
                Some(*at)
            })
            .collect();
        match join(&parts, backend)? {
            Some(linear) => Ok(Joined::One { linear, cuts }),
            None => Ok(Joined::Apart(parts)),
        }
    }

    /// Every part's output for `x` (`[..., in]`), in the order given.
    pub fn forward(&self, x: &Array) -> Result<Vec<Array>> {
        match self {
            Joined::Apart(parts) => parts.iter().map(|p| p.forward(x)).collect(),
            Joined::One { linear, cuts } => Ok(linear.forward(x)?.split_at_indices(cuts, -1)?),
        }
    }

    /// [`Joined::forward`], and where the parts are joined the first `lead` parts' outputs side
    /// by side (one view of the joined output): q and k for one RoPE call.
    pub fn forward_leading(&self, x: &Array, lead: usize) -> Result<(Vec<Array>, Option<Array>)> {
        match self {
            Joined::One { linear, cuts } if (1..=cuts.len()).contains(&lead) => {
                cut_leading(linear.forward(x)?, cuts, lead)
            }
            _ => Ok((self.forward(x)?, None)),
        }
    }

    /// `silu(gate) * up` of a joined gate/up pair in one kernel, where the device's few-row
    /// kernel takes it ([`Linear::forward_swiglu`]); `None` otherwise (split and multiply).
    pub fn swiglu(&self, x: &Array) -> Result<Option<Array>> {
        match self.gate_up_pair() {
            Some(linear) => linear.forward_swiglu(x),
            None => Ok(None),
        }
    }

    /// The joined layer, where it is two parts of equal width (gate rows, then up rows).
    fn gate_up_pair(&self) -> Option<&Linear> {
        match self {
            Joined::One { linear, cuts }
                if cuts.len() == 1 && 2 * cuts[0] == linear.out_features() =>
            {
                Some(linear)
            }
            _ => None,
        }
    }

    /// Bytes of parameters a forward pass reads.
    pub fn nbytes(&self) -> usize {
        match self {
            Joined::Apart(parts) => parts.iter().map(Linear::nbytes).sum(),
            Joined::One { linear, .. } => linear.nbytes(),
        }
    }
}

/// A joined output `y` cut into its parts at `cuts`, and its first `lead` parts as one view.
fn cut_leading(y: Array, cuts: &[i32], lead: usize) -> Result<(Vec<Array>, Option<Array>)> {
    let first = y
        .split_at_indices(&cuts[lead - 1..lead], -1)?
        .into_iter()
        .next();
    Ok((y.split_at_indices(cuts, -1)?, first))
}

/// One layer whose output rows are those of `parts` in order, or None if they differ in kind.
fn join(parts: &[Linear], backend: &dyn Backend) -> Result<Option<Linear>> {
    let biases: Vec<&Array> = parts.iter().filter_map(Linear::bias).collect();
    if !biases.is_empty() && biases.len() != parts.len() {
        return Ok(None);
    }
    let bias = if biases.is_empty() {
        None
    } else {
        Some(ops::concatenate(&biases, 0)?)
    };
    let joined = if let Some(ws) = parts
        .iter()
        .map(Linear::dense_weight)
        .collect::<Option<Vec<_>>>()
    {
        // [out, in] each: rows stacked, then the same transposed view a dense layer keeps.
        let w = ops::concatenate(&ws, 0)?;
        w.eval()?;
        Linear::dense(w, bias, backend)
    } else if let Some(qs) = parts
        .iter()
        .map(Linear::quantized)
        .collect::<Option<Vec<_>>>()
    {
        let (group_size, bits) = (qs[0].3, qs[0].4);
        if qs.iter().any(|q| q.3 != group_size || q.4 != bits) {
            return Ok(None);
        }
        let stack = |arrays: Vec<&Array>| -> Result<Array> {
            let a = ops::concatenate(&arrays, 0)?;
            a.eval()?;
            Ok(a)
        };
        Linear::Quantized {
            w: stack(qs.iter().map(|q| q.0).collect())?,
            scales: stack(qs.iter().map(|q| q.1).collect())?,
            biases: stack(qs.iter().map(|q| q.2).collect())?,
            group_size,
            bits,
            bias,
        }
    } else {
        return Ok(None);
    };
    Ok(Some(joined))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(shape: &[i32]) -> Array {
        mlx_rs::random::normal::<f32>(shape, None, None, None).expect("random")
    }

    fn max_diff(a: &Array, b: &Array) -> f32 {
        ops::abs(ops::subtract(a, b).expect("sub"))
            .expect("abs")
            .max(None)
            .expect("max")
            .item_exact::<f32>()
    }

    fn joining() -> std::rc::Rc<dyn Backend> {
        super::super::for_placement(crate::device::Placement::formulation_on_cpu(false))
    }

    #[test]
    fn joined_dense_layers_give_each_part_its_own_output() {
        let b = joining();
        let p = &*b;
        let apart = vec![
            Linear::dense(rand(&[48, 32]), Some(rand(&[48])), p),
            Linear::dense(rand(&[16, 32]), Some(rand(&[16])), p),
            Linear::dense(rand(&[16, 32]), Some(rand(&[16])), p),
        ];
        let x = rand(&[3, 2, 32]);
        let joined = Joined::new(apart.clone(), p).expect("join");
        assert!(matches!(joined, Joined::One { .. }), "dense parts join");
        let outs = joined.forward(&x).expect("forward");
        for (part, out) in apart.iter().zip(&outs) {
            let want = part.forward(&x).expect("part");
            assert_eq!(out.shape(), want.shape());
            assert!(max_diff(out, &want) < 1e-4);
        }
    }

    #[test]
    fn joined_quantized_layers_give_each_part_its_own_output() {
        let b = joining();
        let p = &*b;
        let quantized = |out: i32| {
            let w = rand(&[out, 64]);
            let (q, s, b) = ops::quantize(&w, 32, 4).expect("quantize");
            Linear::Quantized {
                w: q,
                scales: s,
                biases: b,
                group_size: 32,
                bits: 4,
                bias: None,
            }
        };
        let apart = vec![quantized(64), quantized(32)];
        let x = rand(&[2, 1, 64]);
        let joined = Joined::new(apart.clone(), p).expect("join");
        assert!(matches!(joined, Joined::One { .. }), "quantized parts join");
        for (part, out) in apart.iter().zip(&joined.forward(&x).expect("forward")) {
            assert!(max_diff(out, &part.forward(&x).expect("part")) < 1e-4);
        }
    }

    #[test]
    fn parts_that_differ_in_kind_or_biases_stay_apart() {
        let b = joining();
        let p = &*b;
        let biased = Linear::dense(rand(&[8, 16]), Some(rand(&[8])), p);
        let plain = Linear::dense(rand(&[8, 16]), None, p);
        let joined = Joined::new(vec![biased, plain], p).expect("join");
        assert!(matches!(joined, Joined::Apart(_)));
        let one = vec![Linear::dense(rand(&[8, 16]), None, p)];
        assert!(matches!(
            Joined::new(one, p).expect("new"),
            Joined::Apart(_)
        ));
    }
}
