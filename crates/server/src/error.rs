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
}

impl Error {
    /// The errno the client is answered with.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Engine(e) => e.errno(),
            Error::Errno(e) => *e,
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
        }
    }
}

impl std::error::Error for Error {}

/// The result of a request's execution.
pub type Result<T> = std::result::Result<T, Error>;
