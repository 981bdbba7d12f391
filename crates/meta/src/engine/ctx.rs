//! Per-thread contexts. A context owns one persistent context area of the
//! pool (intent words and a redo journal), allocator segments, and a range of
//! inode numbers. A thread keeps its context in thread-local storage between
//! operations, so the hot path takes no shared lock to find it.

use crate::alloc::{AllocCache, Allocator};
use crate::error::Result;
use parking_lot::{Condvar, Mutex};
use std::cell::RefCell;
use std::sync::{Arc, Weak};

/// One thread's engine context.
pub struct Ctx {
    /// Index of the persistent context area.
    pub id: usize,
    /// Allocation state.
    pub cache: AllocCache,
    /// Next inode number of the reserved range.
    pub ino_next: u64,
    /// End of the reserved range.
    pub ino_end: u64,
    /// To-free entries recorded by the current operation.
    pub freed: Vec<super::FreeJob>,
}

/// Contexts not held by any thread.
pub struct CtxPool {
    free: Mutex<Vec<Option<Box<Ctx>>>>,
    made: Mutex<usize>,
    max: usize,
    cv: Condvar,
}

impl CtxPool {
    pub fn new(max: usize) -> CtxPool {
        CtxPool {
            free: Mutex::new(Vec::new()),
            made: Mutex::new(0),
            max,
            cv: Condvar::new(),
        }
    }

    fn get(&self, alloc: &Allocator) -> Box<Ctx> {
        let mut free = self.free.lock();
        loop {
            if let Some(Some(c)) = free.pop() {
                return c;
            }
            let mut made = self.made.lock();
            if *made < self.max {
                let id = *made;
                *made += 1;
                return Box::new(Ctx {
                    id,
                    cache: alloc.cache(),
                    ino_next: 0,
                    ino_end: 0,
                    freed: Vec::new(),
                });
            }
            drop(made);
            self.cv.wait(&mut free);
        }
    }

    fn put(&self, c: Box<Ctx>) {
        self.free.lock().push(Some(c));
        self.cv.notify_one();
    }
}

struct Local {
    engine: u64,
    ctx: Option<Box<Ctx>>,
    home: Weak<CtxPool>,
}

impl Drop for Local {
    fn drop(&mut self) {
        if let (Some(c), Some(home)) = (self.ctx.take(), self.home.upgrade()) {
            home.put(c);
        }
    }
}

thread_local! {
    static LOCAL: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's context for engine `engine`.
pub fn with_ctx<T>(
    engine: u64,
    pool: &Arc<CtxPool>,
    alloc: &Allocator,
    f: impl FnOnce(&mut Ctx) -> Result<T>,
) -> Result<T> {
    let taken = LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        l.iter_mut()
            .find(|x| x.engine == engine)
            .and_then(|x| x.ctx.take())
    });
    let mut ctx = match taken {
        Some(c) => c,
        None => pool.get(alloc),
    };
    let r = f(&mut ctx);
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        if let Some(x) = l.iter_mut().find(|x| x.engine == engine) {
            x.ctx = Some(ctx);
            return;
        }
        // First use of this engine on this thread: forget closed engines.
        l.retain(|x| x.home.strong_count() > 0);
        l.push(Local {
            engine,
            ctx: Some(ctx),
            home: Arc::downgrade(pool),
        });
    });
    r
}
