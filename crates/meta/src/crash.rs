//! Named crash points (`crash_point!("create.after_publish")`).
//!
//! A crash point costs one relaxed load of a global flag unless armed. Arming
//! (the `SOLOFS_CRASH_POINT=name[:n]` environment variable read at open, or
//! [`arm`]) makes the n-th pass (default the first) abort the process, which
//! leaves the pool exactly as a killed server would.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

static ARMED: AtomicBool = AtomicBool::new(false);
static LEFT: AtomicU64 = AtomicU64::new(0);
static NAME: Mutex<String> = Mutex::new(String::new());

/// Marks an ordering step at which a crash test may kill the process.
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {
        if $crate::crash::armed() {
            $crate::crash::hit($name);
        }
    };
}

/// True if some crash point is armed.
#[inline(always)]
pub fn armed() -> bool {
    ARMED.load(Ordering::Relaxed)
}

/// Arms `name`: its `nth` pass (1 = first) aborts the process.
pub fn arm(name: &str, nth: u64) {
    *NAME.lock().unwrap_or_else(|e| e.into_inner()) = name.to_string();
    LEFT.store(nth.max(1), Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
}

/// Arms from `SOLOFS_CRASH_POINT=name[:n]` if set.
pub fn arm_from_env() {
    if let Ok(v) = std::env::var("SOLOFS_CRASH_POINT") {
        let (name, n) = match v.split_once(':') {
            Some((a, b)) => (a.to_string(), b.parse().unwrap_or(1)),
            None => (v, 1),
        };
        if !name.is_empty() {
            arm(&name, n);
        }
    }
}

#[cold]
#[doc(hidden)]
pub fn hit(name: &str) {
    let armed = NAME.lock().unwrap_or_else(|e| e.into_inner());
    if *armed == name && LEFT.fetch_sub(1, Ordering::SeqCst) == 1 {
        eprintln!("solofs: crash point {name} reached, aborting");
        std::process::abort();
    }
}
