//! The client's errors, and which of them a retry can cure.

use solofs_proto::Body;
use solofs_types::errno;
use std::io;

/// Errors of client calls.
#[derive(Debug)]
pub enum ClientError {
    /// The server executed the request and it failed with this errno.
    Errno(i32),
    /// Connecting or talking to the server failed.
    Io(io::Error),
    /// The server refused the handshake (message from the server).
    Refused(String),
    /// The connection broke while a write was in flight: it may or may not
    /// have been applied.
    ConnectionLost,
    /// No reply within the timeout.
    Timeout,
    /// The server sent something that is not valid protocol.
    Protocol(String),
}

impl ClientError {
    /// The errno this error corresponds to.
    pub fn errno(&self) -> i32 {
        match self {
            ClientError::Errno(e) => *e,
            ClientError::Io(_) | ClientError::Protocol(_) => errno::EIO,
            ClientError::Refused(_) => errno::EACCES,
            ClientError::ConnectionLost => errno::ECONNRESET,
            ClientError::Timeout => errno::ETIMEDOUT,
        }
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Errno(e) => {
                write!(f, "server error: {}", io::Error::from_raw_os_error(*e))
            }
            ClientError::Io(e) => write!(f, "connection: {e}"),
            ClientError::Refused(m) => write!(f, "server refused the connection: {m}"),
            ClientError::ConnectionLost => {
                write!(f, "connection lost while a change was in flight; it may or may not have been applied")
            }
            ClientError::Timeout => write!(f, "no reply from the server in time"),
            ClientError::Protocol(m) => write!(f, "protocol error: {m}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        ClientError::Io(e)
    }
}

/// Result of client calls.
pub type Result<T> = std::result::Result<T, ClientError>;

/// Is `e` a server that cannot be reached right now (worth retrying)?
pub(crate) fn retryable(e: &ClientError) -> bool {
    match e {
        ClientError::ConnectionLost => true,
        ClientError::Io(e) => matches!(
            e.kind(),
            io::ErrorKind::ConnectionRefused
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof
                | io::ErrorKind::TimedOut
                | io::ErrorKind::WouldBlock
                | io::ErrorKind::NotConnected
        ),
        _ => false,
    }
}

pub(crate) fn unexpected(b: Body) -> ClientError {
    ClientError::Protocol(format!("unexpected reply body {b:?}"))
}
