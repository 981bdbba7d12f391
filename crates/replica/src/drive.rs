//! Who drives the Raft node (docs/replication.md, "A member"): no thread
//! of its own. Inputs — messages from the links, proposals, membership
//! changes, ticks — are queued, and the thread that brings one and finds
//! the node free handles every queued input and then one `Ready` (flat
//! combining). So a message is stepped by the thread that read it from its
//! socket and a proposal by the thread that made it, with no hand-over
//! to another thread on the way (each cost a wake-up; on this 2-core
//! machine wake-ups were half a leader's CPU), and inputs that arrive
//! together still share one `Ready` (one `fdatasync` under the `sync`
//! rule).

use crate::node::{Input, Run};
use crate::Error;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The Raft node and its queue of inputs.
pub(crate) struct Driver {
    queue: Mutex<VecDeque<Input>>,
    run: Mutex<Option<Run>>,
    /// Why the node stopped, once it has.
    pub(crate) stopped: Arc<Mutex<Option<String>>>,
    /// A tick is queued (the ticker adds no second one).
    pub(crate) tick_queued: AtomicBool,
}

impl Driver {
    pub(crate) fn new() -> Driver {
        Driver {
            queue: Mutex::new(VecDeque::new()),
            run: Mutex::new(None),
            stopped: Arc::new(Mutex::new(None)),
            tick_queued: AtomicBool::new(false),
        }
    }

    /// Gives the driver its node; inputs queued before are handled now.
    pub(crate) fn install(&self, run: Run) {
        *self.run.lock() = Some(run);
        self.combine();
    }

    /// Is the node still taking part?
    pub(crate) fn running(&self) -> bool {
        self.stopped.lock().is_none()
    }

    /// Hands `i` to the node: handled by this thread now if the node is
    /// free, else by the thread that holds it. False once the node stopped.
    pub(crate) fn deliver(&self, i: Input) -> bool {
        if !self.running() {
            refuse(i);
            return false;
        }
        self.queue.lock().push_back(i);
        self.combine();
        self.running()
    }

    /// Queues `i` without handling it: the next [`Driver::combine`] does
    /// (a proposal is queued under the journal's commit lock, in order,
    /// and handled outside it, by the thread that then waits for it).
    pub(crate) fn enqueue(&self, i: Input) {
        if !self.running() {
            refuse(i);
            return;
        }
        self.queue.lock().push_back(i);
    }

    /// Handles what is queued, if the node is free.
    pub(crate) fn combine(&self) {
        loop {
            let Some(mut g) = self.run.try_lock() else {
                // The holder finds this input in the queue after its own.
                return;
            };
            let Some(run) = g.as_mut() else {
                if !self.running() {
                    for i in self.queue.lock().drain(..) {
                        refuse(i);
                    }
                }
                // Not installed yet: `install` handles what waits.
                return;
            };
            loop {
                let batch: Vec<Input> = self.queue.lock().drain(..).collect();
                if batch.is_empty() {
                    break;
                }
                let mut stop = false;
                for i in batch {
                    if matches!(i, Input::Tick) {
                        self.tick_queued.store(false, Ordering::Release);
                    }
                    stop |= run.input(i);
                }
                if !stop {
                    run.after_inputs();
                }
                if stop || run.failed.is_some() {
                    let why = match run.failed.take() {
                        Some(why) => {
                            // A member whose log cannot be written takes
                            // no further part: it must not vote or
                            // acknowledge.
                            eprintln!(
                                "solofs: replica set member {} stops taking part: {why}",
                                run.node.raft.id
                            );
                            why
                        }
                        None => "stopped".to_string(),
                    };
                    run.finish();
                    *g = None;
                    *self.stopped.lock() = Some(why);
                    drop(g);
                    for i in self.queue.lock().drain(..) {
                        refuse(i);
                    }
                    return;
                }
            }
            drop(g);
            // An input queued after the last look, whose thread found the
            // node held, is this thread's (or the next holder's).
            if self.queue.lock().is_empty() {
                return;
            }
        }
    }
}

/// Answers an input a stopped node will not take.
fn refuse(i: Input) {
    match i {
        Input::Propose(_, answer) | Input::Change(_, answer) => answer.send(Err(Error::Stopped)),
        Input::Fetched(r) => r.discard(),
        Input::Link(_) | Input::Tick | Input::StepDown | Input::Synced(_) | Input::Stop => {}
    }
}

/// Delivers `i` through a driver that may be gone.
pub(crate) fn deliver_to(d: &std::sync::Weak<Driver>, i: Input) -> bool {
    match d.upgrade() {
        Some(d) => d.deliver(i),
        None => {
            refuse(i);
            false
        }
    }
}
