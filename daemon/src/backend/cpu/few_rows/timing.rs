use super::*;
use mlx_rs::random;

#[test]
#[ignore]
fn time_a_decode_steps_weights() {
    let shapes = [
        (576, 576),
        (192, 576),
        (192, 576),
        (576, 576),
        (1536, 576),
        (1536, 576),
        (576, 1536),
    ];
    let mut ws = Vec::new();
    for _ in 0..30 {
        for (n, k) in shapes {
            let w = random::normal::<f32>(&[n, k], None, None, None).unwrap();
            w.eval().unwrap();
            ws.push(Skinny::new(&w).unwrap());
        }
    }
    let head = random::normal::<f32>(&[49152, 576], None, None, None).unwrap();
    head.eval().unwrap();
    ws.push(Skinny::new(&head).unwrap());
    for (name, i) in [("q 576x576", 0), ("k 192x576", 1), ("gate 1536x576", 4)] {
        let x = mlx_rs::ops::ones::<f32>(&[1, 576]).unwrap();
        x.eval().unwrap();
        let t = std::time::Instant::now();
        for _ in 0..1000 {
            ws[i].forward(&x).unwrap().unwrap().eval().unwrap();
        }
        let per = t.elapsed().as_secs_f64() / 1000.0;
        eprintln!("{name} hot, 1 row: {:.1} us per call", per * 1e6);
    }
    for rows in [1, 2, 4, 8, 16] {
        let mut best = f64::MAX;
        for _ in 0..4 {
            let t = std::time::Instant::now();
            for w in &ws {
                let x = mlx_rs::ops::ones::<f32>(&[rows, w.inner as i32]).unwrap();
                let y = w.forward(&x).unwrap().unwrap();
                y.eval().unwrap();
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let x = mlx_rs::ops::ones::<f32>(&[rows, 576]).unwrap();
        let t = std::time::Instant::now();
        ws[ws.len() - 1]
            .forward(&x)
            .unwrap()
            .unwrap()
            .eval()
            .unwrap();
        let h = t.elapsed().as_secs_f64();
        eprintln!(
            "rows {rows}: {:.1} ms per step, head alone {:.1} ms",
            best * 1e3,
            h * 1e3
        );
    }
}
