//! What a Vfs operation fails with. The server answers with errno values
//! (docs/protocol.md); the Vfs names the ones it decides on itself and
//! keeps the rest as they came, and a front end maps the whole enum to
//! errno once, at its edge ([`Error::errno`]: FUSE replies, Python's
//! `OSError`).

use solofs_client::ClientError;
use std::fmt;

/// An error of a Vfs operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// No such file or directory (`ENOENT`).
    NotFound,
    /// The name exists (`EEXIST`).
    Exists,
    /// Permission denied (`EACCES`).
    Access,
    /// Operation not permitted (`EPERM`).
    NotPermitted,
    /// Not an open handle of this Vfs (`EBADF`).
    BadHandle,
    /// A bad argument (`EINVAL`).
    Invalid,
    /// A name longer than the volume allows (`ENAMETOOLONG`).
    NameTooLong,
    /// Not supported by SoloFS (`EOPNOTSUPP`).
    NotSupported,
    /// No such extended attribute (`ENODATA`).
    NoData,
    /// A buffer too small for the answer (`ERANGE`).
    Range,
    /// The inode a handle or name reached is gone from the server
    /// (`ESTALE`: look the path up again).
    Stale,
    /// A lock wait ended by a signal (`EINTR`).
    Interrupted,
    /// The data path or the connection failed (`EIO`).
    Io,
    /// Past the largest file size (`EFBIG`).
    FileTooBig,
    /// No data or hole at or past the offset (`ENXIO`).
    NoSuchOffset,
    /// Not a directory (`ENOTDIR`).
    NotADirectory,
    /// Is a directory (`EISDIR`).
    IsADirectory,
    /// Directory not empty (`ENOTEMPTY`).
    NotEmpty,
    /// No space left (`ENOSPC`).
    NoSpace,
    /// Waiting for the lock would deadlock (`EDEADLK`).
    Deadlock,
    /// The lock is held by another owner (`EAGAIN`).
    WouldBlock,
    /// Any other errno the server or the store answered.
    Os(i32),
}

/// The errno of each named variant.
const NAMED: [(Error, i32); 21] = [
    (Error::NotFound, libc::ENOENT),
    (Error::Exists, libc::EEXIST),
    (Error::Access, libc::EACCES),
    (Error::NotPermitted, libc::EPERM),
    (Error::BadHandle, libc::EBADF),
    (Error::Invalid, libc::EINVAL),
    (Error::NameTooLong, libc::ENAMETOOLONG),
    (Error::NotSupported, libc::EOPNOTSUPP),
    (Error::NoData, libc::ENODATA),
    (Error::Range, libc::ERANGE),
    (Error::Stale, libc::ESTALE),
    (Error::Interrupted, libc::EINTR),
    (Error::Io, libc::EIO),
    (Error::FileTooBig, libc::EFBIG),
    (Error::NoSuchOffset, libc::ENXIO),
    (Error::NotADirectory, libc::ENOTDIR),
    (Error::IsADirectory, libc::EISDIR),
    (Error::NotEmpty, libc::ENOTEMPTY),
    (Error::NoSpace, libc::ENOSPC),
    (Error::Deadlock, libc::EDEADLK),
    (Error::WouldBlock, libc::EAGAIN),
];

impl Error {
    /// The error an errno value stands for.
    pub fn from_errno(e: i32) -> Error {
        NAMED
            .iter()
            .find(|(_, n)| *n == e)
            .map_or(Error::Os(e), |(v, _)| *v)
    }

    /// The errno a front end answers with.
    pub fn errno(self) -> i32 {
        match self {
            Error::Os(e) => e,
            v => NAMED
                .iter()
                .find(|(x, _)| *x == v)
                .map_or(libc::EIO, |(_, n)| *n),
        }
    }
}

impl From<ClientError> for Error {
    fn from(e: ClientError) -> Error {
        Error::from_errno(e.errno())
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        std::io::Error::from_raw_os_error(e.errno())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.errno()))
    }
}

impl std::error::Error for Error {}

/// The result of a Vfs operation.
pub type Res<T> = Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_errno_maps_back_and_others_pass_through() {
        for (v, n) in NAMED {
            assert_eq!(Error::from_errno(n), v);
            assert_eq!(v.errno(), n);
        }
        assert_eq!(Error::from_errno(libc::EXDEV), Error::Os(libc::EXDEV));
        assert_eq!(Error::Os(libc::EXDEV).errno(), libc::EXDEV);
    }
}
