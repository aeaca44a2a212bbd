//! The scheduler's plans, with fake jobs, a fake pool and a fake model runner (no MLX):
//! admission by free blocks, the prefill budget, decode rows, allocation, preemption order,
//! refusals, and block accounting over whole runs.

use std::collections::BTreeSet;

use mlxcel_ipc::BlockId;

use mlxcel_daemon::scheduler::{
    BlockTable, Blocks, Job, Limits, Refusal, Scheduler, SeqKey, StepPlan,
};

/// A fake request: `tokens` to store before its next draw, its table, and its output to come.
#[derive(Debug, Clone, PartialEq)]
struct Fake {
    id: u64,
    tokens: usize,
    table: BlockTable,
    ready: bool,
    /// Its next token is a drawn one (a decode input).
    drawn: bool,
    /// Output tokens still to generate.
    to_generate: usize,
    preemptions: usize,
}

impl Job for Fake {
    fn key(&self) -> SeqKey {
        SeqKey {
            conn: 0,
            request: self.id,
        }
    }
    fn tokens(&self) -> usize {
        self.tokens
    }
    fn decoding(&self) -> bool {
        self.drawn
    }
    fn admissible(&self) -> bool {
        self.ready
    }
    fn table(&self) -> &BlockTable {
        &self.table
    }
    fn table_mut(&mut self) -> &mut BlockTable {
        &mut self.table
    }
    fn preempted(&mut self) {
        self.drawn = false;
        self.preemptions += 1;
    }
}

/// A pool of `total` blocks with one reference count each.
struct Pool {
    refs: Vec<u32>,
    /// Refuse every allocation (memory that cannot be had).
    dry: bool,
}

impl Pool {
    fn new(total: usize) -> Self {
        Pool {
            refs: vec![0; total],
            dry: false,
        }
    }

    fn held(&self) -> BTreeSet<BlockId> {
        (0..self.refs.len() as u32)
            .filter(|&b| self.refs[b as usize] > 0)
            .collect()
    }
}

impl Blocks for Pool {
    fn free_blocks(&self) -> u32 {
        self.refs.iter().filter(|&&r| r == 0).count() as u32
    }
    fn total_blocks(&self) -> u32 {
        self.refs.len() as u32
    }
    fn block_tokens(&self) -> usize {
        BT
    }
    fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        let free: Vec<BlockId> = (0..self.refs.len() as u32)
            .filter(|&b| self.refs[b as usize] == 0)
            .take(n)
            .collect();
        if free.len() < n || self.dry {
            return None;
        }
        for &b in &free {
            self.refs[b as usize] = 1;
        }
        Some(free)
    }
    fn release(&mut self, block: BlockId) {
        let r = &mut self.refs[block as usize];
        assert!(*r > 0, "double free of {block}");
        *r -= 1;
    }
}

fn job(id: u64, tokens: usize) -> Fake {
    Fake {
        id,
        tokens,
        table: BlockTable::default(),
        ready: true,
        drawn: false,
        to_generate: 4,
        preemptions: 0,
    }
}

const BT: usize = 4;

fn scheduler(max_running: usize, prefill_budget: usize) -> Scheduler<Fake> {
    with_whole_chunks(max_running, prefill_budget, false)
}

fn with_whole_chunks(
    max_running: usize,
    prefill_budget: usize,
    whole_chunks: bool,
) -> Scheduler<Fake> {
    Scheduler::new(Limits {
        max_running,
        block_tokens: BT,
        prefill_budget,
        whole_chunks,
    })
}

fn ids(jobs: &[Fake]) -> Vec<u64> {
    jobs.iter().map(|j| j.id).collect()
}

fn keys(keys: &[SeqKey]) -> Vec<u64> {
    keys.iter().map(|k| k.request).collect()
}

fn chunks(plan: &StepPlan<Fake>) -> Vec<(u64, usize)> {
    plan.prefill.iter().map(|(k, n)| (k.request, *n)).collect()
}

/// Marks the planned work done: the chunks and decode tokens are stored.
fn execute(s: &mut Scheduler<Fake>, plan: &StepPlan<Fake>) {
    for j in s.running_mut() {
        if let Some((_, n)) = plan.prefill.iter().find(|(k, _)| *k == j.key()) {
            j.table.len += n;
        }
        if plan.decode.contains(&j.key()) {
            j.table.len += 1;
            j.drawn = false;
        }
    }
}

#[test]
fn admission_is_fifo_by_free_blocks_counting_this_rounds_starts() {
    let mut s = scheduler(8, 64);
    // 3, 2 and 4 blocks.
    for (id, tokens) in [(1, 12), (2, 8), (3, 16)] {
        s.push(job(id, tokens));
    }
    let mut pool = Pool::new(6);
    let plan = s.schedule(&mut pool, false);
    // 3 + 2 fit in 6; the third needs 4 of the 1 left, and stops the round (no overtaking).
    assert_eq!(keys(&plan.admitted), vec![1, 2]);
    assert_eq!(plan.short, Some(3));
    assert_eq!(chunks(&plan), vec![(1, 12), (2, 8)]);
    assert_eq!(
        pool.free_blocks(),
        1,
        "the planned chunks have their blocks"
    );
    execute(&mut s, &plan);
    s.push(job(4, 4));
    let plan = s.schedule(&mut pool, false);
    assert!(plan.admitted.is_empty(), "job 4 must not overtake job 3");
    assert_eq!(plan.short, Some(3));
    // A job that already holds a mapped prefix needs only the rest.
    let mut s = scheduler(8, 64);
    let mut pool = Pool::new(4);
    let mut prefixed = job(5, 16);
    prefixed.table = BlockTable::with_prefix(pool.allocate(3).unwrap(), BT);
    s.push(prefixed);
    let plan = s.schedule(&mut pool, false);
    assert_eq!(keys(&plan.admitted), vec![5]);
    assert_eq!(
        chunks(&plan),
        vec![(5, 4)],
        "only the tokens after the prefix"
    );
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
    let mut pool = Pool::new(100);
    let plan = s.schedule(&mut pool, false);
    assert_eq!(keys(&plan.admitted), vec![2, 3]);
    assert_eq!(s.waiting_len(), 2);
    // Once its prefix is known it is the oldest again.
    s.waiting_mut(|j| j.id == 1).unwrap().ready = true;
    let gone = s.remove(SeqKey {
        conn: 0,
        request: 2,
    });
    gone.unwrap().table.free(&mut pool);
    s.schedule(&mut pool, false);
    assert_eq!(ids(s.running()), vec![3, 1]);
}

#[test]
fn a_job_that_can_never_fit_is_refused_only_when_nothing_runs() {
    let mut s = scheduler(8, 64);
    s.push(job(1, 4));
    s.push(job(2, 400)); // 100 blocks, pool of 50
    s.push(job(3, 4));
    let mut pool = Pool::new(50);
    let plan = s.schedule(&mut pool, false);
    // Job 1 runs; job 2 waits for the pool to be idle before it is judged.
    assert_eq!(keys(&plan.admitted), vec![1]);
    assert!(plan.refused.is_empty());
    assert_eq!(plan.short, Some(100 - 49));
    s.remove(plan.admitted[0]).unwrap().table.free(&mut pool);
    let plan = s.schedule(&mut pool, false);
    let refused: Vec<(u64, Refusal)> = plan.refused.iter().map(|(j, r)| (j.id, *r)).collect();
    assert_eq!(refused, vec![(2, Refusal::LongerThanPool { tokens: 400 })]);
    assert_eq!(ids(s.running()), vec![3]);
}

#[test]
fn the_prefill_budget_is_shared_oldest_first() {
    let mut s = scheduler(8, 512);
    for id in 1..=3 {
        s.push(job(id, 300));
    }
    let mut pool = Pool::new(1000);
    let plan = s.schedule(&mut pool, false);
    assert_eq!(chunks(&plan), vec![(1, 300), (2, 212)]);
    execute(&mut s, &plan);
    let plan = s.schedule(&mut pool, false);
    assert_eq!(chunks(&plan), vec![(2, 88), (3, 300)]);
    // Blocks follow the chunks: 300 tokens = 75 blocks, 212 = 53, then 22 more and 75.
    let held: usize = s.running().iter().map(|j| j.table.blocks.len()).sum();
    assert_eq!(held, 75 + 75 + 75);
    assert_eq!(pool.free_blocks() as usize, 1000 - held);
}

#[test]
fn whole_chunks_split_a_job_only_where_it_comes_first() {
    let mut s = with_whole_chunks(8, 512, true);
    for (id, len) in [(1, 300), (2, 300), (3, 100), (4, 1200)] {
        s.push(job(id, len));
    }
    let mut pool = Pool::new(1000);
    // Job 2 does not fit what job 1 leaves and waits; job 3 fits and fills the step.
    let plan = s.schedule(&mut pool, false);
    assert_eq!(chunks(&plan), vec![(1, 300), (3, 100)]);
    execute(&mut s, &plan);
    let plan = s.schedule(&mut pool, false);
    assert_eq!(chunks(&plan), vec![(2, 300)]);
    execute(&mut s, &plan);
    // Longer than the budget and first: split as before.
    let plan = s.schedule(&mut pool, false);
    assert_eq!(chunks(&plan), vec![(4, 512)]);
}

#[test]
fn a_drawn_token_is_a_decode_row_and_a_recomputed_one_is_prefill() {
    let mut s = scheduler(8, 64);
    for id in 1..=2 {
        s.push(job(id, 4));
    }
    let mut pool = Pool::new(10);
    let plan = s.schedule(&mut pool, false);
    execute(&mut s, &plan);
    // Job 1 drew a token; job 2's prompt grew by one unstored token (recomputation).
    s.running_mut()[0].tokens += 1;
    s.running_mut()[0].drawn = true;
    s.running_mut()[1].tokens += 1;
    let plan = s.schedule(&mut pool, false);
    assert_eq!(keys(&plan.decode), vec![1]);
    assert_eq!(chunks(&plan), vec![(2, 1)]);
    // Each crossed into a new block: one allocated for each.
    let allocated: Vec<(u64, usize)> = plan
        .allocated
        .iter()
        .map(|(k, b)| (k.request, b.len()))
        .collect();
    assert_eq!(allocated, vec![(1, 1), (2, 1)]);
}

#[test]
fn a_short_pool_preempts_the_youngest_which_runs_again_first() {
    let mut s = scheduler(8, 64);
    for id in 1..=4 {
        s.push(job(id, 8));
    }
    let mut pool = Pool::new(6);
    let plan = s.schedule(&mut pool, false);
    assert_eq!(keys(&plan.admitted), vec![1, 2, 3]); // 2 blocks each
    execute(&mut s, &plan);
    // Every job draws a token: job 1's needs a block, and the pool has none.
    for j in s.running_mut() {
        j.tokens += 1;
        j.drawn = true;
    }
    let plan = s.schedule(&mut pool, false);
    assert_eq!(keys(&plan.preempted), vec![3]);
    assert_eq!(plan.freed.len(), 2, "job 3's blocks");
    // Job 3's room went to job 1, then job 2 took the other; job 3 is not planned.
    assert_eq!(keys(&plan.decode), vec![1, 2]);
    assert_eq!(ids(s.running()), vec![1, 2]);
    let j3 = s.waiting_mut(|j| j.id == 3).unwrap();
    assert_eq!((j3.id, j3.preemptions, j3.table.len), (3, 1, 0));
    // Job 3 is back at the front, ahead of job 4 which waited longer but never ran.
    execute(&mut s, &plan);
    for id in [1, 2] {
        s.remove(SeqKey {
            conn: 0,
            request: id,
        })
        .unwrap()
        .table
        .free(&mut pool);
    }
    let plan = s.schedule(&mut pool, false);
    assert_eq!(keys(&plan.admitted), vec![3, 4]);
}

#[test]
fn a_job_alone_that_cannot_grow_is_refused_unless_the_cache_may_give_blocks_back() {
    for reclaimable in [false, true] {
        let mut s = scheduler(8, 64);
        s.push(job(1, 4));
        let mut pool = Pool::new(2);
        let plan = s.schedule(&mut pool, reclaimable);
        execute(&mut s, &plan);
        pool.dry = true; // its next block's memory cannot be had
        s.running_mut()[0].tokens += 1;
        s.running_mut()[0].drawn = true;
        let plan = s.schedule(&mut pool, reclaimable);
        assert!(!plan.has_work());
        assert_eq!(plan.short, Some(1), "the cache is asked for a block");
        if reclaimable {
            assert_eq!(keys(&plan.preempted), vec![1], "it waits for the cache");
            assert!(plan.refused.is_empty());
        } else {
            let refused: Vec<(u64, Refusal)> =
                plan.refused.iter().map(|(j, r)| (j.id, *r)).collect();
            assert_eq!(refused, vec![(1, Refusal::NoRoom)]);
        }
    }
}

/// A fake model runner over `schedule`: each step computes what the plan says; a job whose
/// tokens are all stored draws one more until its output is done, then ends and frees its
/// blocks. Checks every step that the blocks the jobs hold are exactly the pool's held ones.
fn run(mut s: Scheduler<Fake>, total: usize, budget: usize) -> (Vec<u64>, usize) {
    let mut pool = Pool::new(total);
    let mut finished = Vec::new();
    let mut steps = 0;
    while !s.is_idle() || s.has_waiting() {
        steps += 1;
        assert!(steps < 10_000, "the run never ended");
        let plan = s.schedule(&mut pool, false);
        assert!(plan.refused.is_empty());
        assert!(plan.prefill.iter().map(|p| p.1).sum::<usize>() <= budget);
        execute(&mut s, &plan);
        let held: BTreeSet<BlockId> = s
            .running()
            .iter()
            .flat_map(|j| j.table.blocks.iter().copied())
            .collect();
        assert_eq!(held, pool.held(), "step {steps}: held blocks");
        for key in s.running().iter().map(Job::key).collect::<Vec<_>>() {
            let Some(j) = s.running_mut().iter_mut().find(|j| j.key() == key) else {
                continue;
            };
            if j.table.len < j.tokens || j.drawn {
                continue;
            }
            if j.to_generate == 0 {
                let mut j = s.remove(key).unwrap();
                j.table.free(&mut pool);
                finished.push(j.id);
                continue;
            }
            j.to_generate -= 1;
            j.tokens += 1;
            j.drawn = true;
        }
    }
    assert_eq!(pool.free_blocks() as usize, total, "every block came back");
    (finished, steps)
}

#[test]
fn a_fake_run_finishes_every_job_in_arrival_order_within_the_budget() {
    for whole_chunks in [false, true] {
        let mut s = with_whole_chunks(3, 10, whole_chunks);
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

/// One random run's jobs: (prompt tokens, output tokens).
fn arrivals() -> impl proptest::strategy::Strategy<Value = Vec<(usize, usize)>> {
    proptest::collection::vec((1usize..60, 0usize..10), 1..12)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Whatever arrives, whatever the limits and the pool: every step's plan holds the budget
    /// and the batch size, every planned row has its room, the blocks the jobs hold are exactly
    /// the pool's held ones, and the run ends with every job finished or refused (a job only
    /// for a reason that is true) and every block back.
    #[test]
    fn every_random_run_keeps_the_plans_invariants_and_ends(
        jobs in arrivals(),
        max_running in 1usize..6,
        budget in 1usize..64,
        total in 4usize..40,
        whole_chunks: bool,
    ) {
        let mut s = with_whole_chunks(max_running, budget, whole_chunks);
        for (id, &(tokens, out)) in jobs.iter().enumerate() {
            s.push(Fake { to_generate: out, ..job(id as u64, tokens) });
        }
        let mut pool = Pool::new(total);
        let mut ended = BTreeSet::new();
        let mut steps = 0;
        while !s.is_idle() || s.has_waiting() {
            steps += 1;
            proptest::prop_assert!(steps < 20_000, "the run never ended");
            let plan = s.schedule(&mut pool, false);
            proptest::prop_assert!(plan.prefill.iter().map(|p| p.1).sum::<usize>() <= budget);
            proptest::prop_assert!(s.running().len() <= max_running);
            for (j, why) in &plan.refused {
                let fits = (j.tokens + 1).div_ceil(BT) <= total;
                match why {
                    Refusal::LongerThanPool { tokens } => {
                        proptest::prop_assert!(tokens.div_ceil(BT) > total)
                    }
                    // Alone, with every block free but its own: the pool cannot hold it.
                    Refusal::NoRoom => proptest::prop_assert!(!fits || j.tokens.div_ceil(BT) > total),
                }
                proptest::prop_assert!(ended.insert(j.id));
                let mut j = j.clone();
                j.table.free(&mut pool);
            }
            for j in s.running() {
                let planned = plan
                    .prefill
                    .iter()
                    .find(|(k, _)| *k == j.key())
                    .map(|(_, n)| *n)
                    .or_else(|| plan.decode.contains(&j.key()).then_some(1));
                if let Some(n) = planned {
                    proptest::prop_assert!(j.table.blocks.len() * BT >= j.table.len + n);
                }
                if plan.decode.contains(&j.key()) {
                    proptest::prop_assert!(j.drawn);
                }
            }
            execute(&mut s, &plan);
            let held: BTreeSet<BlockId> = s
                .running()
                .iter()
                .flat_map(|j| j.table.blocks.iter().copied())
                .collect();
            let count: usize = s.running().iter().map(|j| j.table.blocks.len()).sum();
            proptest::prop_assert_eq!(count, held.len(), "no block in two tables");
            proptest::prop_assert_eq!(&held, &pool.held());
            for key in s.running().iter().map(Job::key).collect::<Vec<_>>() {
                let Some(j) = s.running_mut().iter_mut().find(|j| j.key() == key) else {
                    continue;
                };
                if j.table.len < j.tokens || j.drawn {
                    continue;
                }
                if j.to_generate == 0 {
                    let mut j = s.remove(key).unwrap();
                    j.table.free(&mut pool);
                    proptest::prop_assert!(ended.insert(j.id));
                    continue;
                }
                j.to_generate -= 1;
                j.tokens += 1;
                j.drawn = true;
            }
        }
        proptest::prop_assert_eq!(ended.len(), jobs.len());
        proptest::prop_assert_eq!(pool.free_blocks() as usize, total);
    }
}
