//! The scheduler's rules, with fake jobs and a fake model runner (no MLX): admission by free
//! blocks, the prefill budget, preemption order, and fairness over a whole run.

use super::*;

/// A fake request: `tokens` to store, of which `stored` are, in `held` blocks.
#[derive(Debug, Clone, PartialEq)]
struct Fake {
    id: u32,
    tokens: usize,
    stored: usize,
    held: usize,
    ready: bool,
    /// Output tokens still to generate.
    to_generate: usize,
}

impl Job for Fake {
    fn tokens(&self) -> usize {
        self.tokens
    }
    fn stored(&self) -> usize {
        self.stored
    }
    fn blocks(&self) -> usize {
        self.held
    }
    fn admissible(&self) -> bool {
        self.ready
    }
}

fn job(id: u32, tokens: usize) -> Fake {
    Fake {
        id,
        tokens,
        stored: 0,
        held: 0,
        ready: true,
        to_generate: 4,
    }
}

const BT: usize = 4;

fn scheduler(max_running: usize, prefill_budget: usize) -> Scheduler<Fake> {
    Scheduler::new(Limits {
        max_running,
        block_tokens: BT,
        prefill_budget,
        whole_chunks: false,
    })
}

fn ids(jobs: &[Fake]) -> Vec<u32> {
    jobs.iter().map(|j| j.id).collect()
}

#[test]
fn admission_is_fifo_by_free_blocks_counting_this_rounds_starts() {
    let mut s = scheduler(8, 64);
    // 3, 2 and 4 blocks.
    for (id, tokens) in [(1, 12), (2, 8), (3, 16)] {
        s.push(job(id, tokens));
    }
    let a = s.admit(6, 100);
    // 3 + 2 fit in 6; the third needs 4 of the 1 left, and stops the round (no overtaking).
    assert_eq!(
        (a.started, a.short, ids(s.running())),
        (2, Some(3), vec![1, 2])
    );
    s.push(job(4, 4));
    let a = s.admit(1, 100);
    assert_eq!(
        (a.started, a.short),
        (0, Some(3)),
        "job 4 must not overtake job 3"
    );
    // A job that already holds a mapped prefix needs only the rest.
    let mut s = scheduler(8, 64);
    s.push(Fake {
        held: 3,
        ..job(5, 16)
    });
    assert_eq!(s.admit(1, 100).started, 1);
}

#[test]
fn max_running_caps_admission_and_a_job_awaiting_its_prefix_does_not_block_others() {
    let mut s = scheduler(2, 64);
    s.push(Fake {
        ready: false,
        ..job(1, 4)
    });
    for id in 2..5 {
        s.push(job(id, 4));
    }
    let a = s.admit(100, 100);
    assert_eq!((a.started, ids(s.running())), (2, vec![2, 3]));
    assert_eq!(s.waiting_len(), 2);
    // Once its prefix is known it is the oldest again.
    s.waiting_mut(|j| j.id == 1).unwrap().ready = true;
    let _ = s.remove_running(0);
    s.admit(100, 100);
    assert_eq!(ids(s.running()), vec![3, 1]);
}

#[test]
fn a_job_that_can_never_fit_is_refused_only_when_nothing_runs() {
    let mut s = scheduler(8, 64);
    s.push(job(1, 4));
    s.push(job(2, 400)); // 100 blocks, pool of 50
    s.push(job(3, 4));
    let a = s.admit(50, 50);
    // Job 1 runs: job 2 waits (it might fit once job 1 is gone? no: 100 > 50, but job 1's
    // end could free blocks only up to the total, so it waits for the pool to be idle).
    assert_eq!((a.started, a.unfit.len(), a.short), (1, 0, Some(100 - 49)));
    let _ = s.remove_running(0);
    let a = s.admit(50, 50);
    assert_eq!((ids(&a.unfit), ids(s.running())), (vec![2], vec![3]));
}

#[test]
fn the_prefill_budget_is_shared_oldest_first() {
    let mut s = scheduler(8, 512);
    for id in 1..=3 {
        s.push(job(id, 300));
    }
    s.admit(1000, 1000);
    assert_eq!(s.prefill_plan(), vec![(0, 300), (1, 212)]);
    s.running_mut()[0].stored = 300;
    s.running_mut()[1].stored = 212;
    assert_eq!(s.prefill_plan(), vec![(1, 88), (2, 300)]);
}

#[test]
fn whole_chunks_split_a_job_only_where_it_comes_first() {
    let mut s = scheduler(8, 512);
    s.limits.whole_chunks = true;
    for (id, len) in [(1, 300), (2, 300), (3, 100), (4, 1200)] {
        s.push(job(id, len));
    }
    s.admit(1000, 1000);
    // Job 2 does not fit what job 1 leaves and waits; job 3 fits and fills the step.
    assert_eq!(s.prefill_plan(), vec![(0, 300), (2, 100)]);
    s.running_mut()[0].stored = 300;
    s.running_mut()[2].stored = 100;
    assert_eq!(s.prefill_plan(), vec![(1, 300)]);
    s.running_mut()[1].stored = 300;
    // Longer than the budget and first: split as before.
    assert_eq!(s.prefill_plan(), vec![(3, 512)]);
}

#[test]
fn preemption_takes_the_youngest_which_runs_again_first() {
    let mut s = scheduler(8, 64);
    for id in 1..=3 {
        s.push(job(id, 8));
    }
    s.push(job(4, 8));
    s.admit(6, 100); // 1, 2, 3 (2 blocks each)
    assert_eq!(ids(s.running()), vec![1, 2, 3]);
    let at = s.preempt_youngest(|j| {
        j.stored = 0;
        j.held = 0;
    });
    assert_eq!((at, ids(s.running())), (Some(2), vec![1, 2]));
    // Job 3 is back at the front, ahead of job 4 which waited longer but never ran.
    s.admit(2, 100);
    assert_eq!(ids(s.running()), vec![1, 2, 3]);
}

/// A fake model runner: each step it computes the planned prefill tokens, then one token for
/// every job whose tokens are all stored; a job ends after its output. Blocks come from a pool
/// of `total`; a job that cannot get the block for its next token preempts the youngest.
fn run(mut s: Scheduler<Fake>, total: u32, budget: usize) -> (Vec<u32>, usize) {
    let mut free = total;
    let mut finished = Vec::new();
    let mut steps = 0;
    while !s.is_idle() || s.has_waiting() {
        steps += 1;
        assert!(steps < 10_000, "the run never ended");
        let a = s.admit(free, total);
        assert!(a.unfit.is_empty());
        let plan = s.prefill_plan();
        assert!(plan.iter().map(|p| p.1).sum::<usize>() <= budget);
        let planned: Vec<usize> = plan.iter().map(|p| p.0).collect();
        for (i, n) in plan {
            let j = &mut s.running_mut()[i];
            let blocks = (j.stored + n).div_ceil(BT);
            free -= (blocks - j.held) as u32;
            j.held = blocks;
            j.stored += n;
        }
        let mut i = 0;
        while i < s.running().len() {
            let j = &s.running()[i];
            if planned.contains(&i) || j.stored < j.tokens {
                i += 1;
                continue;
            }
            if j.to_generate == 0 {
                let j = s.remove_running(i);
                free += j.held as u32;
                finished.push(j.id);
                continue;
            }
            let need = (j.tokens + 1).div_ceil(BT).saturating_sub(j.held) as u32;
            if need > free {
                s.preempt_youngest(|y| {
                    free += y.held as u32;
                    y.held = 0;
                    y.stored = 0;
                });
                continue;
            }
            free -= need;
            let j = &mut s.running_mut()[i];
            j.held += need as usize;
            j.tokens += 1;
            j.stored += 1;
            j.to_generate -= 1;
            i += 1;
        }
    }
    assert_eq!(free, total, "every block came back");
    (finished, steps)
}

#[test]
fn a_fake_run_finishes_every_job_in_arrival_order_within_the_budget() {
    for whole_chunks in [false, true] {
        let mut s = scheduler(3, 10);
        s.limits.whole_chunks = whole_chunks;
        for id in 1..=6 {
            s.push(job(id, 9));
        }
        let (finished, _) = run(s, 40, 10);
        assert_eq!(
            finished,
            vec![1, 2, 3, 4, 5, 6],
            "equal jobs end in the order they came (whole chunks: {whole_chunks})"
        );
    }
}

#[test]
fn a_fake_run_under_a_small_pool_preempts_and_still_finishes_everything() {
    let mut s = scheduler(4, 8);
    for id in 1..=5 {
        s.push(Fake {
            to_generate: 8,
            ..job(id, 6)
        });
    }
    // 8 blocks of 4 tokens: not enough for four jobs growing to 14 tokens (4 blocks) each.
    let (mut finished, _) = run(s, 8, 8);
    finished.sort_unstable();
    assert_eq!(finished, vec![1, 2, 3, 4, 5]);
}
