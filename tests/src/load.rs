//! Steady load on a backend for the fault tests: tasks that each check one key in a loop,
//! recording what every request got and when it was sent, so a test can count admissions,
//! denials and failures per phase of a fault.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use turnstile_core::{Backend, Policy};

/// What one request got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Got {
    /// Decided and admitted.
    Admitted,
    /// Decided and denied.
    Denied,
    /// The check failed (the error is in [`Seen::error`]).
    Failed,
}

/// One request of the load.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The task that sent it.
    pub task: usize,
    /// The key it checked.
    pub key: String,
    /// When it was sent.
    pub sent: Instant,
    /// How long its answer took.
    pub took: Duration,
    /// What it got.
    pub got: Got,
    /// The error, when it failed.
    pub error: Option<String>,
}

/// Admissions, denials and failures among some requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests admitted.
    pub admitted: usize,
    /// Requests denied.
    pub denied: usize,
    /// Requests whose check failed.
    pub failed: usize,
}

impl Counts {
    /// The counts of `seen`.
    pub fn of<'a>(seen: impl IntoIterator<Item = &'a Seen>) -> Self {
        let mut c = Counts::default();
        for s in seen {
            match s.got {
                Got::Admitted => c.admitted += 1,
                Got::Denied => c.denied += 1,
                Got::Failed => c.failed += 1,
            }
        }
        c
    }

    /// Requests counted.
    pub fn total(&self) -> usize {
        self.admitted + self.denied + self.failed
    }
}

/// Tasks checking keys in a loop until stopped.
#[derive(Debug)]
pub struct Load {
    stop: Arc<AtomicBool>,
    /// Per task: requests decided so far (admitted or denied).
    decided: Arc<[AtomicU64]>,
    tasks: Vec<JoinHandle<Vec<Seen>>>,
}

impl Load {
    /// One task per key of `keys`, each checking its key against `policies` at cost 1, then
    /// pausing `pause` before the next request.
    pub fn start<B>(backend: &B, keys: &[String], policies: &[Policy], pause: Duration) -> Self
    where
        B: Backend + Clone + Send + Sync + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let decided: Arc<[AtomicU64]> = keys.iter().map(|_| AtomicU64::new(0)).collect();
        let policies: Arc<[Policy]> = policies.into();
        let tasks = keys
            .iter()
            .enumerate()
            .map(|(task, key)| {
                let (b, pol, key) = (backend.clone(), Arc::clone(&policies), key.clone());
                let (stop, decided) = (Arc::clone(&stop), Arc::clone(&decided));
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    while !stop.load(Ordering::Acquire) {
                        let sent = Instant::now();
                        let result = b.check(&key, &pol, 1).await;
                        let took = sent.elapsed();
                        let (got, error) = match &result {
                            Ok(d) if d.allowed() => (Got::Admitted, None),
                            Ok(_) => (Got::Denied, None),
                            Err(e) => (Got::Failed, Some(e.to_string())),
                        };
                        if got != Got::Failed {
                            decided[task].fetch_add(1, Ordering::AcqRel);
                        }
                        seen.push(Seen {
                            task,
                            key: key.clone(),
                            sent,
                            took,
                            got,
                            error,
                        });
                        tokio::time::sleep(pause).await;
                    }
                    seen
                })
            })
            .collect();
        Load {
            stop,
            decided,
            tasks,
        }
    }

    /// Requests decided so far, all tasks together.
    pub fn decided(&self) -> u64 {
        self.decided.iter().map(|d| d.load(Ordering::Acquire)).sum()
    }

    /// Waits until every task (the task of each key, in the order given to
    /// [`Load::start`]) has had `more` more requests decided than now; panics after `within`.
    pub async fn wait_each_decided(&self, more: u64, within: Duration) {
        let tasks: Vec<usize> = (0..self.decided.len()).collect();
        self.wait_decided_by(&tasks, more, within).await;
    }

    /// Waits until each of `tasks` has had `more` more requests decided than now; panics
    /// after `within`.
    pub async fn wait_decided_by(&self, tasks: &[usize], more: u64, within: Duration) {
        let of = |t: usize| self.decided[t].load(Ordering::Acquire);
        let from: Vec<u64> = tasks.iter().map(|&t| of(t)).collect();
        let deadline = Instant::now() + within;
        while tasks.iter().zip(&from).any(|(&t, &f)| of(t) < f + more) {
            let got: Vec<u64> = tasks.iter().zip(&from).map(|(&t, &f)| of(t) - f).collect();
            assert!(
                Instant::now() < deadline,
                "tasks {tasks:?} had {got:?} more requests decided, not {more} each, within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the tasks; returns every request, in the order they were sent.
    pub async fn stop(self) -> Vec<Seen> {
        self.stop.store(true, Ordering::Release);
        let mut all = Vec::new();
        for t in self.tasks {
            all.extend(t.await.expect("a load task"));
        }
        all.sort_by_key(|s| s.sent);
        all
    }
}

/// The requests of `seen` sent in `[from, to)`.
pub fn sent_between(seen: &[Seen], from: Instant, to: Instant) -> impl Iterator<Item = &Seen> {
    seen.iter().filter(move |s| s.sent >= from && s.sent < to)
}
