//! Per-directory child lists.
//!
//! Every child of a directory gets a *position* from the directory's
//! monotonically increasing `next_pos` counter at create time and keeps it for
//! life (it is stored in the child). The list maps positions to child objects
//! in a radix tree of 512-byte leaf pages (56 slots) under 4 KiB interior
//! nodes (512 children), grown by adding a root level.
//!
//! Why positions and not a linked list of siblings: an unlink clears one slot
//! in O(1) (the child knows its position), a listing never follows a pointer
//! into freed memory, and a readdir cookie is simply "the next position": a
//! listing resumed across concurrent creates and deletes returns every entry
//! that existed throughout exactly once, and positions are never reused, so a
//! removed-then-recreated name can never make the cursor go back. A leaf whose
//! every position has been used and cleared is freed.

use crate::error::{Error, Result};
use crate::format::layout::{
    K_PAGE, NODE_FANOUT, NODE_SIZE, PAGE_SIZE, PAGE_SLOTS, P_SLOTS, S_NORMAL,
};
use crate::format::StateWord;
use crate::pool::Pool;
use std::sync::atomic::Ordering;

/// Allocation context for list maintenance.
pub trait Mem {
    /// The pool.
    fn pool(&self) -> &Pool;
    /// Allocates a zeroed object that will be installed in the word at
    /// `at`; until [`Mem::settled`], a crash frees it unless `at` holds it.
    fn alloc_for(&mut self, size: u32, at: u64) -> Result<u64>;
    /// The object of the last `alloc_for` is installed, or freed.
    fn settled(&mut self) -> Result<()>;
    /// Frees an object.
    fn free(&mut self, off: u64) -> Result<()>;
}

fn capacity(depth: u64) -> u64 {
    PAGE_SLOTS.saturating_mul(NODE_FANOUT.saturating_pow(depth as u32))
}

/// Deepest radix tree (56 × 512^6 positions).
const MAX_LIST_DEPTH: u64 = 6;

fn split_root(w: u64) -> (u64, u64) {
    (w & !15, w & 15)
}

/// The root word at `root`, with its depth checked (a corrupt depth would
/// otherwise overflow the position arithmetic).
fn read_root(pool: &Pool, root: u64) -> Result<(u64, u64)> {
    let (node, depth) = split_root(pool.ld(root)?);
    if depth > MAX_LIST_DEPTH {
        return Err(Error::Corrupt(format!(
            "directory list at {root:#x} claims depth {depth}"
        )));
    }
    Ok((node, depth))
}

/// Offset of the slot word for `pos`, or None if its page does not exist.
pub fn slot(pool: &Pool, root: u64, pos: u64) -> Result<Option<u64>> {
    let (mut node, depth) = read_root(pool, root)?;
    if node == 0 || pos >= capacity(depth) {
        return Ok(None);
    }
    let leaf = pos / PAGE_SLOTS;
    for level in (0..depth).rev() {
        let idx = (leaf / NODE_FANOUT.pow(level as u32)) % NODE_FANOUT;
        node = pool.list_page(node).child(idx).get()?;
        if node == 0 {
            return Ok(None);
        }
    }
    Ok(Some(node + P_SLOTS + 8 * (pos % PAGE_SLOTS)))
}

/// The value at `pos` (0 if empty).
pub fn get(pool: &Pool, root: u64, pos: u64) -> Result<u64> {
    match slot(pool, root, pos)? {
        Some(s) => pool.ld(s),
        None => Ok(0),
    }
}

/// A new page, to be installed at `at` (`Mem::alloc_for`).
fn new_page<M: Mem>(m: &mut M, at: u64) -> Result<u64> {
    let p = m.alloc_for(PAGE_SIZE, at)?;
    m.pool()
        .object(p)
        .set_state(StateWord::new(K_PAGE, S_NORMAL, 0))?;
    m.pool().object(p).persist(PAGE_SIZE as u64);
    Ok(p)
}

/// A new node, to be installed at `at` (`Mem::alloc_for`).
fn new_node<M: Mem>(m: &mut M, at: u64) -> Result<u64> {
    let p = m.alloc_for(NODE_SIZE, at)?;
    m.pool().object(p).persist(NODE_SIZE as u64);
    Ok(p)
}

/// Installs `child` in the word at `at` if it holds `old`, as
/// `child | tag`; frees `child` if another thread won. Either way the
/// allocation is settled first. Returns the word's final value.
fn install<M: Mem>(m: &mut M, at: u64, old: u64, child: u64, tag: u64) -> Result<u64> {
    let w = m.pool().u64(at)?;
    match w.compare_exchange(old, child | tag, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            m.pool().persist(at, 8);
            m.settled()?;
            Ok(child | tag)
        }
        Err(cur) => {
            // Settled first: once freed, `child` may be another's.
            m.settled()?;
            m.free(child)?;
            Ok(cur)
        }
    }
}

/// Offset of the slot word for `pos`, creating pages and levels as needed.
pub fn slot_mut<M: Mem>(m: &mut M, root: u64, pos: u64) -> Result<u64> {
    loop {
        let rw = m.pool().ld(root)?;
        let (node, depth) = read_root(m.pool(), root)?;
        if node == 0 {
            let p = new_page(m, root)?;
            install(m, root, 0, p, 0)?;
            continue;
        }
        if pos >= capacity(depth) {
            if depth >= MAX_LIST_DEPTH {
                return Err(Error::NoSpace);
            }
            let n = new_node(m, root)?;
            m.pool().st(n, node)?;
            m.pool().persist(n, 8);
            install(m, root, rw, n, depth + 1)?;
            continue;
        }
        let leaf = pos / PAGE_SLOTS;
        let mut cur = node;
        for level in (0..depth).rev() {
            let idx = (leaf / NODE_FANOUT.pow(level as u32)) % NODE_FANOUT;
            let at = cur + 8 * idx;
            let mut child = m.pool().ld(at)?;
            if child == 0 {
                let c = if level == 0 {
                    new_page(m, at)?
                } else {
                    new_node(m, at)?
                };
                child = install(m, at, 0, c, 0)?;
            }
            cur = child;
        }
        return Ok(cur + P_SLOTS + 8 * (pos % PAGE_SLOTS));
    }
}

/// Stores `v` at `pos` (creating its page).
pub fn set<M: Mem>(m: &mut M, root: u64, pos: u64, v: u64) -> Result<()> {
    let s = slot_mut(m, root, pos)?;
    m.pool().st(s, v)?;
    m.pool().persist(s, 8);
    Ok(())
}

/// Empties `pos` for good (the position is never used again) and frees its
/// page once every position of the page has been used and emptied.
pub fn retire<M: Mem>(m: &mut M, root: u64, pos: u64) -> Result<()> {
    let Some(s) = slot(m.pool(), root, pos)? else {
        return Ok(());
    };
    m.pool().st(s, 0)?;
    m.pool().persist(s, 8);
    count_dead(m, root, pos, s)
}

/// Counts position `pos` (slot `s`) as dead in its page, and frees the
/// page once all its positions are.
fn count_dead<M: Mem>(m: &mut M, root: u64, pos: u64, s: u64) -> Result<()> {
    let page = s - P_SLOTS - 8 * (pos % PAGE_SLOTS);
    let dead = m.pool().list_page(page).dead().atomic()?;
    if dead.fetch_add(1, Ordering::AcqRel) + 1 == PAGE_SLOTS {
        unlink_page(m, root, pos / PAGE_SLOTS, page)?;
    }
    Ok(())
}

/// Counts a position that was handed out but will never be filled. A
/// position whose page was never allocated (the allocation that failed may
/// be why it is skipped) needs nothing: allocating now could fail again.
pub fn skip<M: Mem>(m: &mut M, root: u64, pos: u64) -> Result<()> {
    let Some(s) = slot(m.pool(), root, pos)? else {
        return Ok(());
    };
    if m.pool().ld(s)? != 0 {
        return Err(Error::Corrupt("skipping a filled list position".into()));
    }
    count_dead(m, root, pos, s)
}

fn unlink_page<M: Mem>(m: &mut M, root: u64, leaf: u64, page: u64) -> Result<()> {
    let (node, depth) = read_root(m.pool(), root)?;
    if depth == 0 {
        return Ok(()); // keep a lone root page
    }
    let mut cur = node;
    for level in (1..depth).rev() {
        let idx = (leaf / NODE_FANOUT.pow(level as u32)) % NODE_FANOUT;
        cur = m.pool().list_page(cur).child(idx).get()?;
        if cur == 0 {
            return Ok(());
        }
    }
    let at = cur + 8 * (leaf % NODE_FANOUT);
    if m.pool()
        .u64(at)?
        .compare_exchange(page, 0, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        m.pool().persist(at, 8);
        m.free(page)?;
    }
    Ok(())
}

/// Visits non-empty slots with position in `[from, end)` in position order,
/// calling `f(pos, value)` until it returns false. Missing pages are skipped
/// without visiting their positions.
pub fn scan(
    pool: &Pool,
    root: u64,
    from: u64,
    end: u64,
    f: &mut dyn FnMut(u64, u64) -> Result<bool>,
) -> Result<()> {
    let (node, depth) = read_root(pool, root)?;
    if node == 0 {
        return Ok(());
    }
    let end = end.min(capacity(depth));
    let mut pos = from;
    while pos < end {
        // Walk down to the page of `pos`, or skip the empty subtree.
        let leaf = pos / PAGE_SLOTS;
        let mut cur = node;
        let mut skip_to = None;
        for level in (0..depth).rev() {
            let span = NODE_FANOUT.pow(level as u32);
            let idx = (leaf / span) % NODE_FANOUT;
            cur = pool.list_page(cur).child(idx).get()?;
            if cur == 0 {
                skip_to = Some((leaf / span + 1) * span * PAGE_SLOTS);
                break;
            }
        }
        if let Some(next) = skip_to {
            pos = next;
            continue;
        }
        let page_end = ((leaf + 1) * PAGE_SLOTS).min(end);
        while pos < page_end {
            let v = pool.list_page(cur).slot(pos % PAGE_SLOTS).get()?;
            if v != 0 && !f(pos, v)? {
                return Ok(());
            }
            pos += 1;
        }
    }
    Ok(())
}

/// Calls `f` for every page and node offset of the list (fsck, rmdir).
pub fn for_each_node(
    pool: &Pool,
    root: u64,
    f: &mut dyn FnMut(u64, bool) -> Result<()>,
) -> Result<()> {
    fn walk(
        pool: &Pool,
        n: u64,
        depth: u64,
        f: &mut dyn FnMut(u64, bool) -> Result<()>,
    ) -> Result<()> {
        if depth > 0 {
            for i in 0..NODE_FANOUT {
                let c = pool.list_page(n).child(i).get()?;
                if c != 0 {
                    walk(pool, c, depth - 1, f)?;
                }
            }
        }
        f(n, depth == 0)
    }
    let (node, depth) = read_root(pool, root)?;
    if node == 0 {
        return Ok(());
    }
    walk(pool, node, depth, f)
}

/// Frees every page and node of a list and empties its root word.
pub fn destroy<M: Mem>(m: &mut M, root: u64) -> Result<()> {
    let mut nodes = Vec::new();
    for_each_node(m.pool(), root, &mut |n, _| {
        nodes.push(n);
        Ok(())
    })?;
    m.pool().st(root, 0)?;
    m.pool().object(root).persist(8);
    for n in nodes {
        m.free(n)?;
    }
    Ok(())
}
