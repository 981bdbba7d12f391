//! The in-process transport: a client in the server's own process
//! (`solofs up`) hands requests over as values. Everything but the socket is
//! what a connection gets: root squash, open registration (released when the
//! client goes), execution, metrics.

use crate::metrics::Metrics;
use crate::opens::ConnOpens;
use crate::Shared;
use solofs_proto::{InProcess, NoticeSink, Reply, Request, Welcome};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A client connection without a socket; see [`crate::Server::in_process`].
pub struct LocalConn {
    shared: Arc<Shared>,
    opens: ConnOpens,
    m: Arc<Metrics>,
    watcher: Arc<crate::watch::Watcher>,
    /// Who holds this client's file locks.
    session: u128,
    /// Counted among the server's connections (not the server's own).
    counted: bool,
}

impl LocalConn {
    pub(crate) fn new(shared: Arc<Shared>, m: Arc<Metrics>) -> LocalConn {
        LocalConn::with(shared, m, true)
    }

    /// The server's own client (the trash's sweeper): not counted as a
    /// connection.
    pub(crate) fn internal(shared: Arc<Shared>, m: Arc<Metrics>) -> LocalConn {
        LocalConn::with(shared, m, false)
    }

    fn with(shared: Arc<Shared>, m: Arc<Metrics>, counted: bool) -> LocalConn {
        if counted {
            shared.connections.fetch_add(1, Ordering::SeqCst);
            m.connections.fetch_add(1, Ordering::Relaxed);
        }
        let session = crate::batch::session_of(&shared.nonce());
        let watcher = shared
            .watch
            .join(crate::watch::Sink::Local(Default::default()), session);
        let _ = shared.locks.attach(session, &watcher);
        let opens = ConnOpens::new(shared.opens.clone());
        opens.serves(session);
        *watcher.info.lock() = Some(crate::watch::ConnInfo {
            peer: if counted {
                "in-process".into()
            } else {
                "in-process (the server's own)".into()
            },
            key: None,
            since: std::time::SystemTime::now(),
            opens: opens.counter(),
        });
        LocalConn {
            opens,
            watcher,
            session,
            shared,
            m,
            counted,
        }
    }
}

impl InProcess for LocalConn {
    fn welcome(&self) -> Welcome {
        self.shared.welcome()
    }

    fn run(&self, mut reqs: Vec<Request>) -> Vec<Reply> {
        let mut replies = Vec::with_capacity(reqs.len());
        let (mine, told) = crate::batch::run_batch(
            &self.shared,
            &self.opens,
            &self.watcher,
            &self.m,
            &mut reqs,
            &mut replies,
            (None, self.session),
        );
        crate::batch::commit(&self.shared);
        if !mine.is_empty() {
            self.watcher.deliver(mine);
        }
        // Other connections have the notices before the replies return.
        if !told.wait() {
            self.m.notice_waits_expired.fetch_add(1, Ordering::Relaxed);
        }
        replies
    }

    fn watch(&self, sink: NoticeSink) {
        self.watcher.set_sink(sink);
    }
}

impl Drop for LocalConn {
    fn drop(&mut self) {
        self.shared.watch.leave(&self.watcher);
        // Nothing in this process can claim them again.
        self.shared.locks.drop_all(self.session);
        self.shared.locks.detach(self.session, &self.watcher);
        if self.counted {
            self.shared.connections.fetch_sub(1, Ordering::SeqCst);
            self.m.connections.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
