//! Engine errors. Every variant maps to one errno value, which is what the
//! wire protocol carries.

use thiserror::Error;

/// Result of engine calls.
pub type Result<T> = std::result::Result<T, Error>;

/// An engine error; [`Error::errno`] gives the POSIX error number.
#[derive(Debug, Error)]
pub enum Error {
    /// ENOENT
    #[error("no such file or directory")]
    NotFound,
    /// EEXIST
    #[error("file exists")]
    Exists,
    /// ENOTDIR
    #[error("not a directory")]
    NotDir,
    /// EISDIR
    #[error("is a directory")]
    IsDir,
    /// ENOTEMPTY
    #[error("directory not empty")]
    NotEmpty,
    /// EACCES
    #[error("permission denied")]
    Access,
    /// EPERM
    #[error("operation not permitted")]
    Perm,
    /// EINVAL
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    /// ENAMETOOLONG
    #[error("file name too long")]
    NameTooLong,
    /// ELOOP
    #[error("too many levels of symbolic links")]
    Loop,
    /// ENOSPC
    #[error("no space left in the metadata pool")]
    NoSpace,
    /// ENODATA
    #[error("no such attribute")]
    NoData,
    /// ERANGE
    #[error("result out of range")]
    Range,
    /// E2BIG
    #[error("attribute value too large")]
    TooBig,
    /// EFBIG
    #[error("file too large (the limit is 16 TiB)")]
    FileTooBig,
    /// EBUSY
    #[error("resource busy")]
    Busy,
    /// EOPNOTSUPP
    #[error("operation not supported")]
    NotSupported,
    /// ENODEV
    #[error("not a regular file")]
    NoDevice,
    /// EMLINK
    #[error("too many links")]
    TooManyLinks,
    /// EOVERFLOW
    #[error("value too large for defined data type")]
    Overflow,
    /// EIO: the pool contains something impossible.
    #[error("pool is corrupt: {0}")]
    Corrupt(String),
    /// EIO: the pool was written by another format version.
    #[error("pool has format version {found}; this build reads version {expected}")]
    Version {
        /// Version found in the header.
        found: u32,
        /// Version this build reads.
        expected: u32,
    },
    /// EBUSY: another process has the pool open.
    #[error("pool {0} is in use by another process (it is locked)")]
    Locked(String),
    /// EIO: an operating-system call on the pool file failed.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// EIO: the engine stopped accepting writes after an impossible state.
    #[error("engine is poisoned and refuses writes: {0}")]
    Poisoned(String),
}

impl Error {
    /// Builds an `Io` error with context.
    pub fn io(ctx: String, e: std::io::Error) -> Error {
        Error::Io(ctx, e)
    }

    /// The errno value of this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::FileTooBig => libc::EFBIG,
            Error::Exists => libc::EEXIST,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::Access => libc::EACCES,
            Error::Perm => libc::EPERM,
            Error::Invalid(_) => libc::EINVAL,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::Loop => libc::ELOOP,
            Error::NoSpace => libc::ENOSPC,
            Error::NoData => libc::ENODATA,
            Error::Range => libc::ERANGE,
            Error::TooBig => libc::E2BIG,
            Error::Busy | Error::Locked(_) => libc::EBUSY,
            Error::NotSupported => libc::EOPNOTSUPP,
            Error::TooManyLinks => libc::EMLINK,
            Error::NoDevice => libc::ENODEV,
            Error::Overflow => libc::EOVERFLOW,
            Error::Corrupt(_) | Error::Version { .. } | Error::Io(..) | Error::Poisoned(_) => {
                libc::EIO
            }
        }
    }
}
