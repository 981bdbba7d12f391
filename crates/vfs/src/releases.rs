//! Closes sent in the background. The kernel does not wait for a release;
//! neither does the FUSE thread that gets it: it queues the release here
//! and answers at once. One sender thread ends all queued opens in one
//! request (`release_many`), so a closed file costs the server a fraction
//! of a request. Data and size were committed at flush, before the release.

use parking_lot::{Condvar, Mutex};
use solofs_client::{Client, Closed, MAX_RELEASES};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a release may wait for others to share its request (it
/// delays nothing a program waits for: only when the server may delete
/// the blocks of a file unlinked while it was open).
const GATHER: Duration = Duration::from_millis(10);
/// Releases that go at once, without waiting for more.
const ENOUGH: usize = 256;

#[derive(Default)]
struct Queue {
    list: Vec<Closed>,
    stop: bool,
}

pub(crate) struct Releases {
    q: Arc<(Mutex<Queue>, Condvar)>,
    sender: Mutex<Option<JoinHandle<()>>>,
}

impl Releases {
    pub fn start(client: Client) -> Releases {
        let q: Arc<(Mutex<Queue>, Condvar)> = Arc::default();
        let q2 = q.clone();
        let sender = std::thread::Builder::new()
            .name("solofs-release".into())
            .spawn(move || send_loop(&q2, &client))
            .ok();
        Releases {
            q,
            sender: Mutex::new(sender),
        }
    }

    /// Queues one release. The sender is woken only by the first of a
    /// burst (it then gathers for [`GATHER`]) and when [`ENOUGH`] wait: a
    /// wake-up per close would cost the closing thread a futex call and the
    /// sender a sleep and a wake per file.
    pub fn push(&self, c: Closed) {
        let (m, cv) = &*self.q;
        let n = {
            let mut g = m.lock();
            g.list.push(c);
            g.list.len()
        };
        if n == 1 || n == ENOUGH {
            cv.notify_one();
        }
    }

    /// Sends what is queued and stops the sender.
    pub fn stop(&self) {
        {
            let (m, cv) = &*self.q;
            m.lock().stop = true;
            cv.notify_one();
        }
        if let Some(h) = self.sender.lock().take() {
            let _ = h.join();
        }
    }
}

impl Drop for Releases {
    fn drop(&mut self) {
        self.stop();
    }
}

fn send_loop(q: &(Mutex<Queue>, Condvar), client: &Client) {
    let (m, cv) = q;
    loop {
        let (list, stop) = {
            let mut g = m.lock();
            while g.list.is_empty() && !g.stop {
                cv.wait(&mut g);
            }
            // Let the closes of a burst share the request.
            let deadline = Instant::now() + GATHER;
            while !g.stop && g.list.len() < ENOUGH {
                if cv.wait_until(&mut g, deadline).timed_out() {
                    break;
                }
            }
            let n = g.list.len().min(MAX_RELEASES);
            (g.list.drain(..n).collect::<Vec<_>>(), g.stop)
        };
        if !list.is_empty() {
            if let Err(e) = client.release_many(list) {
                eprintln!("solofs: release: {e}");
            }
        }
        if stop && m.lock().list.is_empty() {
            return;
        }
    }
}
