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
}

impl LocalConn {
    pub(crate) fn new(shared: Arc<Shared>, m: Arc<Metrics>) -> LocalConn {
        shared.connections.fetch_add(1, Ordering::SeqCst);
        m.connections.fetch_add(1, Ordering::Relaxed);
        LocalConn {
            opens: ConnOpens::new(shared.opens.clone()),
            watcher: shared
                .watch
                .join(crate::watch::Sink::Local(Default::default())),
            shared,
            m,
        }
    }
}

impl InProcess for LocalConn {
    fn welcome(&self) -> Welcome {
        self.shared.welcome()
    }

    fn run(&self, mut reqs: Vec<Request>) -> Vec<Reply> {
        let mut replies = Vec::with_capacity(reqs.len());
        let mine = crate::conn::run_batch(
            &self.shared,
            &self.opens,
            &self.watcher,
            &self.m,
            &mut reqs,
            &mut replies,
            None,
        );
        if !mine.is_empty() {
            self.watcher.deliver(mine);
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
        self.shared.connections.fetch_sub(1, Ordering::SeqCst);
        self.m.connections.fetch_sub(1, Ordering::Relaxed);
    }
}
