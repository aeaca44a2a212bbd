//! What the engine is doing while it starts (loading the model, each warm-up stage), for the
//! server's `Starting` answers: `/health` says "starting" with it until the daemon serves.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What a stage is reported to.
type Report = Arc<dyn Fn(&str) + Send + Sync>;

/// Where the engine reports each start-up stage (nowhere by default).
#[derive(Clone, Default)]
pub struct Progress {
    report: Option<Report>,
    /// Hold the warm-up until this file exists (`--hold-warm-up-until`, for tests of the
    /// starting state: a start that cannot end before they have seen it).
    hold: Option<PathBuf>,
}

impl Progress {
    /// Stages go to `report`.
    pub fn new(report: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Progress {
            report: Some(Arc::new(report)),
            hold: None,
        }
    }

    /// The same, and the warm-up waits for `file` to exist.
    pub fn holding_until(mut self, file: Option<PathBuf>) -> Self {
        self.hold = file;
        self
    }

    /// Says that the engine is at `stage` now.
    pub fn report(&self, stage: &str) {
        tracing::debug!(stage, "starting");
        if let Some(report) = &self.report {
            report(stage);
        }
    }

    /// Waits for the hold file, if there is one (reported as a stage while it waits).
    pub fn hold(&self) {
        let Some(file) = &self.hold else { return };
        self.report(&format!("warm-up held until {} exists", file.display()));
        while !file.exists() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Progress")
            .field("reported", &self.report.is_some())
            .field("hold", &self.hold)
            .finish()
    }
}
