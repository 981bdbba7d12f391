//! The operation table: one line per operation, from which the [`Op`]
//! enum, its wire code and metric name, whether it is read-only, its
//! encoding and decoding, and the server's dispatch trait [`Serve`] all
//! follow. Adding an operation is adding a line here (and its handler,
//! which the compiler then asks for).

use crate::codec::{DecodeError, Reader, Writer};
use crate::fields::{
    Closed, Field, Loc, OpenFlags, ReleaseFlags, Target, INLINE, NAME, PATH, VALUE,
};
use solofs_types::extents::Extents;
use solofs_types::{Access, SetAttr};

/// What an operation does, for resending, the reply record and keys
/// (the table's fourth column).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Changes nothing: resent after a reconnect as it is, not recorded,
    /// allowed to read-only keys.
    Read,
    /// Changes the volume: recorded (a retry is answered from the reply
    /// record, applied once), refused to read-only keys.
    Write,
    /// Opens a file: resent (a new connection holds none of the old
    /// one's opens, and it registers there), not recorded; a read-only
    /// key may open for reading only.
    Open,
    /// Ends opens of this connection: not resent as a read, not recorded
    /// (a retry on a new connection finds nothing to end), allowed to
    /// read-only keys.
    Close,
}

/// Declares the operations. Each line: wire code, variant, handler name
/// (also the metric label), its [`Kind`] (`read`, `write`, `open`,
/// `close`), and the fields in wire order; a byte-string field may give its length limit (`= max`; the
/// default is `PATH`).
macro_rules! ops {
    ($(
        $(#[doc = $doc:literal])*
        $code:literal $variant:ident $method:ident $kind:ident
            $({ $($field:ident : $ty:ty $(= $max:expr)?),* $(,)? })?;
    )*) => {
        /// An operation and its arguments (field meanings: docs/protocol.md §5).
        #[allow(missing_docs)]
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Op {
            $( $(#[doc = $doc])* $variant $({ $($field: $ty),* })?, )*
        }

        /// The server side of the table: one handler per operation, given
        /// the operation's fields. [`Op::serve`] calls the one that matches.
        // Fields are passed as the enum holds them (`&Vec<u8>`), all of
        // them (a lock request has eight).
        #[allow(clippy::ptr_arg, clippy::too_many_arguments)]
        pub trait Serve {
            /// What a handler returns.
            type Out;
            $(
                $(#[doc = $doc])*
                fn $method(&self $($(, $field: &$ty)*)?) -> Self::Out;
            )*
        }

        const CODES: &[u16] = &[$($code),*];
        const NAMES: &[&str] = &[$(stringify!($method)),*];

        impl Op {
            /// Number of operation codes.
            pub const COUNT: usize = CODES.len();

            /// The operation code on the wire.
            pub fn code(&self) -> u16 {
                match self {
                    $( Op::$variant { .. } => $code, )*
                }
            }

            /// What the operation does ([`Kind`]).
            pub fn kind(&self) -> Kind {
                match self {
                    $( Op::$variant { .. } => ops!(@kind $kind), )*
                }
            }

            /// True for operations that change nothing (safe to resend
            /// after a reconnect): reads and opens.
            pub fn is_read_only(&self) -> bool {
                match self.kind() {
                    Kind::Read | Kind::Open => true,
                    Kind::Write | Kind::Close => false,
                }
            }

            /// Runs the handler of this operation.
            pub fn serve<S: Serve + ?Sized>(&self, s: &S) -> S::Out {
                match self {
                    $( Op::$variant $({ $($field),* })? => s.$method($($($field),*)?), )*
                }
            }

            pub(crate) fn put_args(&self, w: &mut Writer) {
                match self {
                    $( Op::$variant $({ $($field),* })? => { $($( $field.put(w); )*)? } )*
                }
            }

            /// `None` for an unknown code.
            pub(crate) fn get_args(
                code: u16,
                r: &mut Reader,
            ) -> Option<Result<Op, DecodeError>> {
                let get = |r: &mut Reader| -> Result<Op, DecodeError> {
                    Ok(match code {
                        $( $code => Op::$variant $({
                            $($field: <$ty as Field>::get(r, ops!(@max $($max)?))?),*
                        })?, )*
                        _ => unreachable!("known codes only"),
                    })
                };
                CODES.contains(&code).then(|| get(r))
            }
        }
    };
    (@kind read) => { Kind::Read };
    (@kind write) => { Kind::Write };
    (@kind open) => { Kind::Open };
    (@kind close) => { Kind::Close };
    (@max) => { PATH };
    (@max $max:expr) => { $max };
}

// Codes are the position in the table (NAMES is indexed by code).
const _: () = {
    let mut i = 0;
    while i < CODES.len() {
        assert!(
            CODES[i] as usize == i,
            "operation codes must run 0, 1, 2, …"
        );
        i += 1;
    }
};

ops! {
    /// Does nothing (the transport's ceiling).
    0 Noop noop read;
    /// Attributes of an entry (`At`: lookup; `Path`: stat, or lstat if
    /// `follow` is false).
    1 Lookup lookup read { loc: Loc, follow: bool };
    /// Attributes of an inode.
    2 Getattr getattr read { target: Target };
    /// Change attributes.
    3 Setattr setattr write { target: Target, set: SetAttr };
    /// Create a regular file (exclusive).
    4 Create create write { loc: Loc, mode: u32 };
    /// Create a node of any non-directory type.
    5 Mknod mknod write { loc: Loc, mode: u32, rdev: u64 };
    /// Create a directory.
    6 Mkdir mkdir write { loc: Loc, mode: u32 };
    /// Create a symbolic link.
    7 Symlink symlink write { loc: Loc, target: Vec<u8> = PATH };
    /// Target of a symlink.
    8 Readlink readlink read { target: Target };
    /// Remove a non-directory.
    9 Unlink unlink write { loc: Loc };
    /// Remove an empty directory.
    10 Rmdir rmdir write { loc: Loc };
    /// Add a name for an existing file.
    11 Link link write { from: Target, to: Loc };
    /// Rename, with RENAME_NOREPLACE / RENAME_EXCHANGE flags.
    12 Rename rename write { from: Loc, to: Loc, flags: u32 };
    /// List a directory from a cookie.
    13 Readdir readdir read { dir: Target, cookie: u64, max: u32 };
    /// List with attributes.
    14 ReaddirPlus readdirplus read { dir: Target, cookie: u64, max: u32 };
    /// File-system statistics.
    15 Statfs statfs read;
    /// Value of an extended attribute.
    16 Getxattr getxattr read { target: Target, name: Vec<u8> = NAME + 1 };
    /// Set an extended attribute.
    17 Setxattr setxattr write {
        target: Target,
        name: Vec<u8> = NAME + 1,
        value: Vec<u8> = VALUE + 1,
        flags: u32,
    };
    /// Names of the extended attributes.
    18 Listxattr listxattr read { target: Target };
    /// Remove an extended attribute.
    19 Removexattr removexattr write { target: Target, name: Vec<u8> = NAME + 1 };
    /// Check permission bits (R=4, W=2, X=1).
    20 Access access read { target: Target, mask: u32 };
    /// Opens a regular file for reading, writing or both: checks
    /// permission, registers the open on this connection (its blocks
    /// outlive an unlink until the last release) and returns fresh
    /// attributes (close-to-open). Read-only for resending: a new
    /// connection holds none of the old one's opens.
    21 Open open open { ino: u64, flags: OpenFlags };
    /// Ends one `Open` of this connection.
    22 Release release close { ino: u64, flags: ReleaseFlags };
    /// A writer's flush: size grows to `size` (never shrinks), mtime is set.
    /// Through a connection that holds the file open for writing it needs
    /// no write permission (the open checked it). Then `set`, if it
    /// changes anything, is applied as `Setattr` would (the attribute
    /// changes the mount held back while the file was open: a file's data,
    /// size, times, mode and owner travel in one request). `stored`: the
    /// byte ranges the writer stored since its last commit (the file's
    /// data map grows by them; docs/format.md §5.3c).
    23 WriteCommit write_commit write {
        ino: u64,
        size: u64,
        mtime: i64,
        stored: Extents,
        set: SetAttr,
    };
    /// `open(O_CREAT|O_EXCL)`: creates a regular file and opens it as
    /// `Open` does, without checking the new file's permission bits
    /// (POSIX: the creating open gets the access it asked for, so a file
    /// created read-only can still be written through it). `ino`: 0 (the
    /// server numbers the file), or a number of this client's grant
    /// (`Inos`), above every one it used before: the file gets it (a
    /// create answered by the client before the server's reply; `EINVAL`
    /// for a number not so granted).
    // (`access` last: a bad access word is found once the request's
    // other fields are read, and the frame's next request decodes.)
    24 CreateOpen create_open write { loc: Loc, mode: u32, ino: u64, access: Access };
    /// Ends several opens of this connection at once (each as `Release`):
    /// a mount sends its closes in the background, many per request.
    25 ReleaseMany release_many close { opens: Vec<Closed> };
    /// Forgets every inode the server watched for this connection and
    /// starts watching again (after a `Full` notice, once the client's
    /// caches of that time have expired). Read-only: it changes no file.
    26 Rewatch rewatch read;
    /// A writer's flush of a whole small file, kept in the metadata pool
    /// instead of the object store: `data` is the file's content (its size
    /// is `data`'s length), mtime is set, then `set` as `WriteCommit`
    /// does. Only for a regular file that is kept inline already or empty,
    /// and `data` no longer than the volume's inline threshold (WELCOME);
    /// else `EFBIG`, and the writer stores blocks instead.
    27 WriteInline write_inline write { ino: u64, data: Vec<u8> = INLINE, mtime: i64, set: SetAttr };
    /// Sets or clears a lock of `owner` (an id of the client's choosing;
    /// with the client's id it names the holder) on bytes `start..=end` of
    /// `ino`: `kind` 0 shared, 1 exclusive, 2 unlock (docs/protocol.md §9).
    /// `flags`: 1 wait (a conflict queues the request, answered `Queued`,
    /// and a `Granted` notice with `token` follows), 2 reclaim (a lock held
    /// before a reconnect or a server restart), 4 delegate (the client can
    /// take the file's locks over: a grant may answer `Delegated`, and the
    /// client then decides this file's locks itself until a `Recall`
    /// notice or its lease ends). Granted: `Empty` (or the file's
    /// attributes); a
    /// conflict without wait: `EAGAIN`; a wait that would deadlock:
    /// `EDEADLK`. Read-only for resending: setting a lock twice is setting
    /// it once.
    28 Lock lock read {
        ino: u64,
        owner: u64,
        kind: u32,
        start: u64,
        end: u64,
        pid: u32,
        flags: u32,
        token: u64,
    };
    /// The first lock of another owner that a lock of `kind` by `owner`
    /// over `start..=end` of `ino` would conflict with (`LockHeld`), or
    /// none (`Empty`).
    29 GetLock get_lock read { ino: u64, owner: u64, kind: u32, start: u64, end: u64 };
    /// Withdraws the waiting `Lock` request `token` of this client:
    /// `Empty` if it was still waiting, `ENOENT` if it was granted (or
    /// never queued).
    30 LockCancel lock_cancel read { token: u64 };
    /// Releases every lock of this client and withdraws its waiting
    /// requests (a mount going away).
    31 DropLocks drop_locks read;
    /// `fallocate(2)` of bytes `off..off + len` (`mode`: 0, `KEEP_SIZE`
    /// 1, `PUNCH_HOLE` 2 with `KEEP_SIZE`, `ZERO_RANGE` 0x10), after the
    /// writer zeroed or deleted the blocks it stores there. Through a
    /// connection that holds the file open for writing it needs no write
    /// permission. Answers the new attributes.
    32 Fallocate fallocate write { ino: u64, mode: u32, off: u64, len: u64 };
    /// The byte ranges of `ino` that hold data, below its size (`Map`):
    /// `SEEK_DATA` and `SEEK_HOLE`.
    33 DataMap data_map read { ino: u64 };
    /// `open(O_TMPFILE)` in directory `parent`: makes an anonymous
    /// regular file (kept by the server until it is linked or its last
    /// open ends; docs/protocol.md §5) and opens it as `CreateOpen` does.
    34 Tmpfile tmpfile write { parent: u64, mode: u32, access: Access };
    /// `linkat` of anonymous file `ino` (from `Tmpfile`) to `to`: it gets
    /// that name (`EEXIST` if taken) and is anonymous no more.
    35 LinkTmpfile link_tmpfile write { ino: u64, to: Loc };
    /// What the server says of itself and its clients (`solofs status`),
    /// as text: `Bytes`. Only for root on the volume secret (a client key
    /// gets `EACCES`, another user `EPERM`).
    36 Status status read;
    /// Online garbage collection (`solofs gc`): `start` asks for a run
    /// (`dry_run`: report only); every call answers the report so far as
    /// text (`Bytes`, its first line `running` or `done`). Only for root
    /// on the volume secret.
    37 Gc gc read { start: bool, dry_run: bool };
    /// Hands back the locks of `ino` delegated to this client: `locks`
    /// (`put_lock_list`) are all it holds there now; the delegation ends.
    /// Without a delegation (the server restarted, or the client was lost
    /// past its grace) each lock is claimed as `Lock` with reclaim is, and
    /// one taken meanwhile by another client is lost (`ENOLCK`).
    38 LockReturn lock_return read { ino: u64, locks: Vec<u8> = VALUE + 1 };
    /// Renews the lease of this client's delegations: answers (`Bytes`,
    /// little-endian u64s) the files whose locks stay delegated to it (a
    /// file being recalled is not among them).
    39 LockRenew lock_renew read;
    /// Grants this client `count` (1..=65 536) inode numbers never handed
    /// out before, for its `CreateOpen`s with `ino`: answers `Bytes`, the
    /// first number and the end (two little-endian u64s). The grant
    /// replaces the client's last one; it is kept in the reply record, so
    /// it outlives a restart of the server and a failover.
    40 Inos inos write { count: u32 };
}

impl Op {
    /// Short name of an operation code (metrics labels, logs).
    pub fn name(code: u16) -> &'static str {
        NAMES.get(code as usize).copied().unwrap_or("unknown")
    }

    /// Calls `f` with each directory this request names an entry in by
    /// inode (`Loc::At`): where it looks up, makes, removes or renames.
    pub fn named_dirs(&self, mut f: impl FnMut(u64)) {
        let mut dir = |loc: &Loc| {
            if let Loc::At(p, _) = loc {
                f(*p)
            }
        };
        match self {
            Op::Lookup { loc, .. }
            | Op::Create { loc, .. }
            | Op::Mknod { loc, .. }
            | Op::Mkdir { loc, .. }
            | Op::Symlink { loc, .. }
            | Op::Unlink { loc }
            | Op::Rmdir { loc }
            | Op::CreateOpen { loc, .. }
            | Op::Link { to: loc, .. }
            | Op::LinkTmpfile { to: loc, .. } => dir(loc),
            Op::Rename { from, to, .. } => {
                dir(from);
                dir(to);
            }
            // No entry named by its directory's inode (every operation is
            // named: a new one must say).
            Op::Noop
            | Op::Inos { .. }
            | Op::Getattr { .. }
            | Op::Setattr { .. }
            | Op::Readlink { .. }
            | Op::Readdir { .. }
            | Op::ReaddirPlus { .. }
            | Op::Statfs
            | Op::Status
            | Op::Gc { .. }
            | Op::Getxattr { .. }
            | Op::Setxattr { .. }
            | Op::Listxattr { .. }
            | Op::Removexattr { .. }
            | Op::Access { .. }
            | Op::Open { .. }
            | Op::Release { .. }
            | Op::WriteCommit { .. }
            | Op::ReleaseMany { .. }
            | Op::Rewatch
            | Op::WriteInline { .. }
            | Op::Lock { .. }
            | Op::GetLock { .. }
            | Op::LockCancel { .. }
            | Op::DropLocks
            | Op::LockReturn { .. }
            | Op::LockRenew
            | Op::Fallocate { .. }
            | Op::DataMap { .. }
            | Op::Tmpfile { .. } => {}
        }
    }
}
