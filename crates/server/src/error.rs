//! What a request fails with on the server: the engine's error, or an
//! errno the server decides itself (locks, the connection's own state).
//! Either way the client gets an errno (`Reply::result`).

use std::fmt;

/// An error of a request.
#[derive(Debug)]
pub enum Error {
    /// The engine refused or failed.
    Engine(solofs_meta::Error),
    /// The server's own answer (a lock conflict, a deadlock, …).
    Errno(i32),
    /// A keys file, key line or key setting that cannot be used (the
    /// message says which and why).
    Config(String),
    /// Work of the server's own that failed: deleting blocks, taking a
    /// snapshot (the message says what).
    Failed(String),
}

impl Error {
    /// The errno the client is answered with.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Engine(e) => e.errno(),
            Error::Errno(e) => *e,
            Error::Config(_) => solofs_meta::errno::EINVAL,
            Error::Failed(_) => solofs_meta::errno::EIO,
        }
    }
}

impl From<solofs_meta::Error> for Error {
    fn from(e: solofs_meta::Error) -> Error {
        Error::Engine(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Engine(e) => write!(f, "{e}"),
            Error::Errno(e) => write!(f, "errno {e}"),
            Error::Config(m) | Error::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

/// The result of a request's execution.
pub type Result<T> = std::result::Result<T, Error>;
